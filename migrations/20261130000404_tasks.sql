-- Tasks (SPEC W4, seed 004): one row per unit of work a batch owes — one per (batch, target),
-- uk_tasks_batch_target is the last line of defence against a cancel enqueued twice. The
-- seed's progress query is a GROUP BY on state (index_tasks_progress_by_batch).
--
-- state (the platform retry kit's WorkTable `TASKS`: an in-place lease, attempts counted on
-- claim, republished_at arms the due sweep):
--   PENDING  inserted by the batch's materialiser (INSERT ... SELECT, a chunk at a time) with
--            its `market.cancel_tasks.created` message in the same transaction. cancel-orders
--            claims a due row (attempts + 1), cancels the order and settles, in one
--            transaction; after a failed attempt below the limit it stays PENDING with
--            last_error and next_attempt_at = the backoff, and the due sweep re-publishes it.
--   DONE     terminal. PENDING -> DONE by cancel-orders: it cancelled the order (finished_at).
--   SKIPPED  terminal. PENDING -> SKIPPED by cancel-orders: the order was already FILLED or
--            CANCELLED, so nothing was needed (principle 7); last_error says which.
--   FAILED   PENDING -> FAILED by cancel-orders at the attempt limit, or at once when the
--            order does not exist; with a dead letter. FAILED -> PENDING only by ops (retry).
CREATE TABLE tasks (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    type            VARCHAR(32)     NOT NULL,
    batch_id        BIGINT UNSIGNED NOT NULL,
    target_id       BIGINT UNSIGNED NOT NULL,
    state           VARCHAR(16)     NOT NULL DEFAULT 'PENDING',
    attempts        INT UNSIGNED    NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMP(6)    NULL DEFAULT CURRENT_TIMESTAMP(6),
    republished_at  TIMESTAMP(6)    NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_error      VARCHAR(1000)   NULL,
    finished_at     TIMESTAMP(6)    NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_tasks_batch_target (batch_id, target_id),
    -- Progress: counts by state of one batch.
    KEY index_tasks_progress_by_batch (batch_id, state),
    -- The due sweep: PENDING rows whose next attempt has come.
    KEY index_tasks_due (state, next_attempt_at),
    CONSTRAINT fk_tasks_batch FOREIGN KEY (batch_id) REFERENCES task_batches (id),
    CONSTRAINT ck_tasks_type CHECK (type IN ('CANCEL_OPEN_ORDER')),
    CONSTRAINT ck_tasks_state CHECK (state IN ('PENDING', 'DONE', 'SKIPPED', 'FAILED')),
    CONSTRAINT ck_tasks_finished CHECK ((state IN ('DONE', 'SKIPPED')) = (finished_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
