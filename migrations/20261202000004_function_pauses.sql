-- Functions paused by ops (docs/operations.md): a row here stops every process's consumers of
-- that function taking deliveries (within a couple of seconds: each process reads this table
-- every second); deleting it resumes them. The messages wait in the function's queue.
CREATE TABLE function_pauses (
    function_name   VARCHAR(64)     NOT NULL,
    paused_by       VARCHAR(100)    NOT NULL,
    reason          VARCHAR(1000)   NOT NULL,
    paused_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (function_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
