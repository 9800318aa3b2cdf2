-- Deliveries a function skipped (a duplicate, a message about a row already past it): they
-- change nothing, so no workflow row records them, yet "where did this money go" must show
-- them (paybus trace). One row per skipped delivery, kept as long as the outbox keeps its
-- published rows (the relay's prune), found by the entity its message names (shard_key).
CREATE TABLE skipped_deliveries (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    function_name   VARCHAR(64)     NOT NULL,
    message_id      CHAR(36)        NOT NULL,
    correlation_id  CHAR(36)        NOT NULL,
    routing_key     VARCHAR(190)    NOT NULL,
    shard_key       VARCHAR(190)    NULL,
    reason          VARCHAR(1000)   NOT NULL,
    skipped_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    KEY index_skipped_deliveries_by_entity (function_name, shard_key, id),
    KEY index_skipped_deliveries_for_prune (skipped_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
