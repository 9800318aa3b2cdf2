-- Withdrawal status history: one row per transition of a withdrawal, written in the same
-- transaction as the conditional UPDATE that made it (and only when that UPDATE affected a
-- row, so a skipped duplicate confirmation leaves no history).
--
-- No state machine: rows are append-only, never updated or deleted. from_status is NULL for
-- the row that records the creation. from_status is for display: under contention it may be
-- read from a snapshot (seed 001 §4-4); the transition itself is decided by the UPDATE.
CREATE TABLE withdrawal_status_history (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    withdrawal_id   BIGINT UNSIGNED NOT NULL,
    from_status     VARCHAR(16)     NULL,
    to_status       VARCHAR(16)     NOT NULL,
    reason          VARCHAR(1000)   NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    KEY index_withdrawal_status_history_by_withdrawal (withdrawal_id, id),
    CONSTRAINT fk_withdrawal_status_history_withdrawal
        FOREIGN KEY (withdrawal_id) REFERENCES withdrawals (id),
    CONSTRAINT ck_withdrawal_status_history_from
        CHECK (from_status IS NULL OR from_status IN
               ('REQUESTED', 'PROCESSING', 'BROADCASTING', 'STALE', 'CONFIRMED', 'FAILED')),
    CONSTRAINT ck_withdrawal_status_history_to
        CHECK (to_status IN ('REQUESTED', 'PROCESSING', 'BROADCASTING', 'STALE', 'CONFIRMED', 'FAILED'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
