-- Messages a consumer held because they are newer than it knows (paybus_bus::held): a rolling
-- deploy's new producer sent them before every consumer of their function was upgraded. A
-- process that knows the version sends each one again and marks it released; nothing here is
-- a failure, and nothing waits on the broker's delivery limit.
CREATE TABLE held_messages (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    function_name   VARCHAR(64)     NOT NULL,
    message_id      VARCHAR(64)     NOT NULL,
    routing_key     VARCHAR(190)    NOT NULL,
    version         SMALLINT UNSIGNED NOT NULL,
    body            MEDIUMBLOB      NOT NULL,
    held_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    released_at     TIMESTAMP(6)    NULL,
    PRIMARY KEY (id),
    -- A redelivered copy of a held message is held once.
    UNIQUE KEY uq_held_messages_message (function_name, message_id),
    KEY ix_held_messages_waiting (released_at, function_name, version)
) ENGINE = InnoDB;
