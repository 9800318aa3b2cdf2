-- What each function did per minute (paybus_platform::bus::activity): each process adds its
-- in-memory tally every 10 s, after each Lambda invocation and when it stops. The console's
-- charts read the last hour by minute and the last day by hour; the sweeper's sampler prunes
-- rows past PAYBUS_ACTIVITY_RETENTION_DAYS.
CREATE TABLE function_activity (
    function_name VARCHAR(64) NOT NULL,
    minute_at DATETIME NOT NULL,
    done BIGINT UNSIGNED NOT NULL DEFAULT 0,
    skipped BIGINT UNSIGNED NOT NULL DEFAULT 0,
    retried BIGINT UNSIGNED NOT NULL DEFAULT 0,
    failed BIGINT UNSIGNED NOT NULL DEFAULT 0,
    -- Clustered by time: the charts read a range of minutes, every function's at once.
    PRIMARY KEY (minute_at, function_name)
) ENGINE = InnoDB;

-- The bus sampled once a minute by the sweeper's sampler: each function queue's ready
-- messages and consumers (NULL: the broker could not be asked)...
CREATE TABLE queue_samples (
    minute_at DATETIME NOT NULL,
    queue_name VARCHAR(190) NOT NULL,
    ready BIGINT UNSIGNED NULL,
    consumers INT UNSIGNED NULL,
    PRIMARY KEY (minute_at, queue_name)
) ENGINE = InnoDB;

-- ...and the outbox's backlog and the age of its oldest unpublished message.
CREATE TABLE outbox_samples (
    minute_at DATETIME NOT NULL,
    backlog BIGINT UNSIGNED NOT NULL,
    oldest_seconds DOUBLE NOT NULL,
    PRIMARY KEY (minute_at)
) ENGINE = InnoDB;
