-- Markets (SPEC W4, seed 004): a symbol whose orders are matched, and whether it trades.
--
-- status:
--   ACTIVE     inserted by the admin API; orders may be placed. SUSPENDED -> ACTIVE only by
--              resume, and only once the suspension's cancellation is complete (no PENDING
--              task and no open order left): resuming a half-cancelled market is the seed's
--              incident again.
--   SUSPENDED  ACTIVE -> SUSPENDED by suspend: one short transaction, a conditional UPDATE
--              (`WHERE symbol = ? AND status = 'ACTIVE'`) plus the task batch that freezes the
--              cancel set. Order placement reads this row LOCK IN SHARE MODE and is refused
--              while SUSPENDED, so it serialises with suspend: block first, then enqueue what
--              exists, and nothing slips in between.
--
-- current_batch_id: the cancel batch of the latest suspension (task_batches), NULL before the
-- first one.
CREATE TABLE markets (
    id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    symbol           VARCHAR(32)     NOT NULL,
    status           VARCHAR(16)     NOT NULL DEFAULT 'ACTIVE',
    suspended_at     TIMESTAMP(6)    NULL,
    resumed_at       TIMESTAMP(6)    NULL,
    current_batch_id BIGINT UNSIGNED NULL,
    created_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_markets_symbol (symbol),
    CONSTRAINT ck_markets_status CHECK (status IN ('ACTIVE', 'SUSPENDED')),
    CONSTRAINT ck_markets_suspended CHECK (status <> 'SUSPENDED' OR suspended_at IS NOT NULL)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
