-- Idempotency-Key on the partner API's POSTs (api/src/partner/idempotency.rs; the IETF
-- httpapi draft's and Stripe's semantics): the first request with a key runs, and its answer
-- (status and body) is kept; the same key with the same request answers that again without a
-- second effect; with another request (method, path or body) 422; while the first is still
-- running 409. Kept at least 24 h (pruned past that by the API itself).
--
-- The effect's own exactly-once does not rest on this table: a request whose process died
-- after its effect committed but before its answer was kept leaves an IN_PROGRESS row; once
-- locked_until passes, a retry takes the row over and runs again, and the effect's own
-- unique key (p2p_*_orders.idempotency_key) finds what the first run created.
--
-- status: IN_PROGRESS (locked_until bounds it) -> DONE (response_status, response_body).
-- A 5xx answer is not kept: the row is deleted so a retry runs again.
CREATE TABLE partner_idempotency_keys (
    partner_id           BIGINT UNSIGNED  NOT NULL,
    idempotency_key      VARCHAR(255)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- SHA-256 of method, path and body: what "the same request" means.
    request_fingerprint  BINARY(32)       NOT NULL,
    status               VARCHAR(16)      NOT NULL DEFAULT 'IN_PROGRESS',
    locked_until         TIMESTAMP(6)     NOT NULL,
    response_status      SMALLINT UNSIGNED NULL,
    response_body        MEDIUMTEXT       NULL,
    created_at           TIMESTAMP(6)     NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    completed_at         TIMESTAMP(6)     NULL,
    PRIMARY KEY (partner_id, idempotency_key),
    -- The prune: rows past their retention, oldest first.
    KEY index_partner_idempotency_keys_prune (created_at),
    CONSTRAINT ck_partner_idempotency_keys_status CHECK (status IN ('IN_PROGRESS', 'DONE'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
