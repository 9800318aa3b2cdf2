-- Transactional outbox (SPEC §3, principle 5): a message is written in the same transaction as
-- the state change that creates it, published after commit with publisher confirms, and
-- re-published by the relay until the broker has confirmed it.
--
-- Lifecycle: inserted by a producer (published_at NULL) -> published_at set by the producer's
-- immediate publish or by the relay -> deleted by the relay's pruner after retention.
CREATE TABLE outbox_messages (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    message_id      CHAR(36)        NOT NULL,
    routing_key     VARCHAR(190)    NOT NULL,
    correlation_id  CHAR(36)        NOT NULL,
    body            MEDIUMBLOB      NOT NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    published_at    TIMESTAMP(6)    NULL,
    publish_attempts INT UNSIGNED   NOT NULL DEFAULT 0,
    last_error      VARCHAR(1000)   NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_outbox_messages_message_id (message_id),
    -- The relay's claim: unpublished rows, oldest first.
    KEY index_outbox_messages_unpublished (published_at, id),
    KEY index_outbox_messages_for_prune (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
