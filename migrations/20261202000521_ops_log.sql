-- The ops log (docs/operations.md#the-ops-log): every ops action (a function paused or resumed,
-- a bonus job retried, a market suspended or resumed, a suspension's failed tasks retried, a p2p
-- order rechecked, a partner created), one row each, written by `paybus_platform::ops_log::append`
-- in the transaction that acts, so the action and its row commit together. Append-only: nothing
-- in paybus updates or deletes a row.
--
-- Tamper-evident: each row carries the hash of the row before it (`prev_hash`, 64 zeros for row
-- 1) and its own (`row_hash`: SHA-256 over seq, created_at, actor, action, subject, detail and
-- prev_hash). `seq` is assigned by the appender, 1, 2, 3, ... without gaps (not AUTO_INCREMENT,
-- which leaves gaps on a rollback), so a deleted row shows as a missing number. `paybus audit`
-- (check `ops_log_chain`) walks the chain and names the first broken link.
--
-- created_at is chosen by the appender and bound, never filled by the server, so the hash is
-- recomputable from the row; its DEFAULT is there only so no server mode adds an implicit
-- ON UPDATE CURRENT_TIMESTAMP to the first TIMESTAMP column.
CREATE TABLE ops_log (
    seq         BIGINT UNSIGNED NOT NULL,
    created_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    actor       VARCHAR(100)    NOT NULL,
    -- `function.pause`, `bonus_job.retry`, `market.suspend`, ...
    action      VARCHAR(64)     NOT NULL,
    -- What it acted on: `function:confirm-withdrawal`, `charge_event_job:42`, `market:BTC-USDT`.
    subject     VARCHAR(200)    NOT NULL,
    -- A JSON object: what the action did (a pause's reason, the tasks a retry moved, ...).
    detail      MEDIUMTEXT      NOT NULL,
    prev_hash   CHAR(64)        CHARACTER SET ascii NOT NULL,
    row_hash    CHAR(64)        CHARACTER SET ascii NOT NULL,
    PRIMARY KEY (seq),
    -- The continuous auditor's window: the rows written since an instant.
    KEY index_ops_log_recent (created_at),
    CONSTRAINT ck_ops_log_seq CHECK (seq >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- The log's head: one row, the last seq and its hash. Every append locks it FOR UPDATE first,
-- which serialises appends even on an empty log (a locking read of an empty ops_log locks
-- nothing under READ COMMITTED), and it tells the verifier where the log must end, so a deleted
-- tail is seen. Seeded with seq 0 and the genesis hash, row 1's prev_hash.
CREATE TABLE ops_log_head (
    id          TINYINT UNSIGNED NOT NULL,
    seq         BIGINT UNSIGNED NOT NULL,
    row_hash    CHAR(64)         CHARACTER SET ascii NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT ck_ops_log_head_one_row CHECK (id = 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

INSERT INTO ops_log_head (id, seq, row_hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
