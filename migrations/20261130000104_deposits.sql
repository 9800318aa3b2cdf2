-- Deposits: funds a partner received on chain (SPEC W2, seed 001).
--
-- status:
--   DETECTED   inserted by the chain-monitor webhook intake when a tx to a partner address
--              is seen. A re-sent webhook for the same tx hits uk_deposit_tx_to_active and
--              creates nothing.
--   CONFIRMED  terminal. DETECTED -> CONFIRMED only by confirm-deposit (conditional UPDATE);
--              the same transaction CREDITs `amount` (ledger idem_key DEP_CREDIT:{id}) and,
--              when fee > 0, records the FEE `fee` (DEP_FEE:{id}).
--   FAILED     terminal. DETECTED -> FAILED by the intake (tx dropped or reorged away) or by
--              ops. A FAILED row leaves the active key, so the same (tx_hash, to_address) may
--              be detected again as a new row.
--
-- "Unique active (tx_hash, to_address)": MySQL has no partial index, so active_tx_key is a
-- stored generated column that is NULL for FAILED rows (a UNIQUE key admits many NULLs) and
-- 'tx_hash|to_address' otherwise. It is binary-collated: chain identifiers are compared
-- exactly (base58 addresses are case-sensitive); the intake normalises hex case.
CREATE TABLE deposits (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id      BIGINT UNSIGNED NOT NULL,
    currency        VARCHAR(16)     NOT NULL,
    amount          DECIMAL(36,18)  NOT NULL,
    fee             DECIMAL(36,18)  NOT NULL DEFAULT 0,
    tx_hash         VARCHAR(128)    NOT NULL,
    to_address      VARCHAR(255)    NOT NULL,
    status          VARCHAR(16)     NOT NULL DEFAULT 'DETECTED',
    active_tx_key   VARCHAR(400) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
        GENERATED ALWAYS AS (IF(status <> 'FAILED', CONCAT(tx_hash, '|', to_address), NULL)) STORED,
    confirmed_at    TIMESTAMP(6)    NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_deposit_tx_to_active (active_tx_key),
    KEY index_deposits_by_partner (partner_id, created_at),
    KEY index_deposits_by_tx_hash (tx_hash),
    CONSTRAINT fk_deposits_partner FOREIGN KEY (partner_id) REFERENCES partners (id),
    CONSTRAINT ck_deposits_status CHECK (status IN ('DETECTED', 'CONFIRMED', 'FAILED')),
    CONSTRAINT ck_deposits_amount CHECK (amount > 0),
    CONSTRAINT ck_deposits_fee CHECK (fee >= 0 AND fee <= amount),
    CONSTRAINT ck_deposits_confirmed CHECK (status <> 'CONFIRMED' OR confirmed_at IS NOT NULL)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
