-- One dead letter per failure (docs/operations.md): a letter is what failed (the
-- function, the message, the reason); every failure of it is counted, and a failure of a letter
-- that was archived or replayed reopens it. Before this, a second failure of the same message
-- or of identical bytes without a message id was swallowed by INSERT IGNORE, and after its group
-- was archived a repeat made no new letter at all.
--
-- dead_letter_failures holds one row per failure the runtime decided, keyed by the id it stamps
-- on the dead-lettered message (x-paybus-failure-id): a DLQ that redelivers the same dead
-- letter is recorded once, a new failure always counts.
ALTER TABLE dead_letters
    ADD COLUMN failures INT UNSIGNED NOT NULL DEFAULT 1,
    ADD COLUMN last_failed_at TIMESTAMP(6) NULL,
    ADD COLUMN reopened_at TIMESTAMP(6) NULL;

CREATE TABLE dead_letter_failures (
    failure_id      VARCHAR(100)    NOT NULL,
    dead_letter_id  VARCHAR(100)    NOT NULL,
    failed_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (failure_id),
    KEY index_dead_letter_failures_by_letter (dead_letter_id, failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
