-- Partner API keys: how a partner proves who it is to the partner API (/v1/partner/*,
-- api/src/partner/keys.rs).
--
-- A key is shown once, when an ADMIN creates it: `pbk_<id>_<secret>`, the secret 32 random
-- bytes in base64url. Only HMAC-SHA256(PAYBUS_PARTNER_KEY_HASH_KEY, secret) is stored: a
-- database dump alone can neither use a key nor test guesses against it (the hash key lives
-- outside the database). The id in the prefix finds the row without scanning hashes.
--
-- A key is usable while revoked_at IS NULL and (expires_at IS NULL OR expires_at > now):
--   - revoke (ADMIN): revoked_at = now, refused from the next request on;
--   - rotate (ADMIN): a new key for the same partner, and expires_at = now + overlap on the
--     old one, so both work during the overlap and the old one not after;
--   - last_used_at is written at most once a minute per key (a write per request would be a
--     hot row under load).
CREATE TABLE partner_api_keys (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id    BIGINT UNSIGNED NOT NULL,
    secret_hash   BINARY(32)      NOT NULL,
    label         VARCHAR(190)    NULL,
    created_by    VARCHAR(190)    NOT NULL,
    created_at    TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    expires_at    TIMESTAMP(6)    NULL,
    revoked_at    TIMESTAMP(6)    NULL,
    last_used_at  TIMESTAMP(6)    NULL,
    PRIMARY KEY (id),
    -- An ADMIN's list of one partner's keys.
    KEY index_partner_api_keys_of_partner (partner_id, id),
    CONSTRAINT fk_partner_api_keys_partner FOREIGN KEY (partner_id) REFERENCES partners (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Per-partner rate limits of the partner API (NULL: PAYBUS_PARTNER_RATE_LIMIT's default).
ALTER TABLE partners
    ADD COLUMN rate_limit_per_second INT UNSIGNED NULL,
    ADD COLUMN rate_limit_burst      INT UNSIGNED NULL;
