-- Terminal failures, one row per dead-lettered delivery (SPEC §3, principle 9): what ops query,
-- group by function and reason, replay (dry-run first) and archive.
--
-- status: NEW (written by the dead-letter recorder, which drains every paybus.<function>.dlq) -> REPLAYED (by `paybus dead-letters replay`)
--         or ARCHIVED (by `paybus dead-letters archive`).
CREATE TABLE dead_letters (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    -- x-paybus-dead-letter-id, or derived from x-death for the broker's own dead letters:
    -- recording the same dead letter twice (a redelivered DLQ message) keeps one row.
    dead_letter_id  VARCHAR(100)    NOT NULL,
    function_name   VARCHAR(64)     NOT NULL,
    -- NULL when the body was not even a readable envelope.
    message_id      VARCHAR(64)     NULL,
    correlation_id  VARCHAR(64)     NULL,
    routing_key     VARCHAR(190)    NOT NULL,
    reason          VARCHAR(64)     NOT NULL,
    error           TEXT            NOT NULL,
    attempts        INT UNSIGNED    NOT NULL DEFAULT 0,
    body            MEDIUMBLOB      NOT NULL,
    headers         TEXT            NULL,
    failed_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    status          VARCHAR(16)     NOT NULL DEFAULT 'NEW',
    replayed_at     TIMESTAMP(6)    NULL,
    archived_at     TIMESTAMP(6)    NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_dead_letters_dead_letter_id (dead_letter_id),
    KEY index_dead_letters_by_function_reason (function_name, reason, status),
    KEY index_dead_letters_by_message (message_id),
    KEY index_dead_letters_by_status_time (status, failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
