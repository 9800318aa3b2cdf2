-- The canary: a ping sent through the whole path (outbox -> relay -> broker -> consumer ->
-- database) so ops can prove the pipeline end to end (`paybus ping`), and the bus runtime's
-- own tests have a real function to drive.
--
-- status: PENDING (inserted with its outbox message by `paybus ping`) -> PONGED (by the
-- canary function's conditional UPDATE, exactly once however often the message arrives).
CREATE TABLE canary_pings (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    status      VARCHAR(16)     NOT NULL DEFAULT 'PENDING',
    -- Counts effects: stays 1 under duplicate deliveries (the test of exactly-once).
    pongs       INT UNSIGNED    NOT NULL DEFAULT 0,
    created_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    ponged_at   TIMESTAMP(6)    NULL,
    PRIMARY KEY (id),
    CONSTRAINT chk_canary_pings_status CHECK (status IN ('PENDING', 'PONGED'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
