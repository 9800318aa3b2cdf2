-- Partner webhook secrets, sealed at rest (AES-256-GCM under PAYBUS_SECRETS_KEY, see
-- paybus_platform::sealed): a dump, replica or backup of this table holds no usable secret.
--
-- Several rows per partner, so a secret rotates with overlap
-- (paybus_partners::webhook_secrets::rotate):
--   expires_at NULL       the partner's current secret (the newest such row signs
--                         X-Paybus-Signature and comes first in webhook-signature).
--   expires_at in future  an earlier secret still signing (webhook-signature carries one
--                         `v1,` entry per unexpired secret) until the overlap ends.
--   expires_at past       no longer signs; kept for the record.
--
-- key_id names the key that sealed the row (the first 8 hex digits of its SHA-256), so rows
-- under an old key open while `paybus secrets rotate-key` re-seals them (a conditional UPDATE
-- on key_id). The ciphertext is bound to its partner by the AAD
-- `partner_webhook_secrets:<partner_id>`: copied to another partner's row, it does not open.
-- ciphertext: the secret (32 bytes; a legacy one up to 255) plus the 16-byte GCM tag.
CREATE TABLE partner_webhook_secrets (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id  BIGINT UNSIGNED NOT NULL,
    key_id      VARCHAR(32)     NOT NULL,
    nonce       VARBINARY(12)   NOT NULL,
    ciphertext  VARBINARY(512)  NOT NULL,
    created_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    expires_at  TIMESTAMP(6)    NULL,
    PRIMARY KEY (id),
    -- The claim's read of a partner's signing secrets.
    KEY index_partner_webhook_secrets_signing (partner_id, expires_at),
    -- rotate-key's walk over the rows under an old key.
    KEY index_partner_webhook_secrets_by_key (key_id, id),
    CONSTRAINT fk_partner_webhook_secrets_partner FOREIGN KEY (partner_id) REFERENCES partners (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- The plaintext column is emptied by the sealing step `paybus migrate` (and the migrate
-- Lambda) runs after the migrations (paybus_partners::webhook_secrets::seal_plaintext: SQL
-- cannot encrypt). It stays, NULL, for this release so a rolled-back deploy's code still
-- finds its column; dropping it is for a later release. The audit check
-- partner_secrets_sealed reports any value left in it.
ALTER TABLE partners MODIFY webhook_secret VARCHAR(255) NULL;
