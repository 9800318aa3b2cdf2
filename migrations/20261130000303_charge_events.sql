-- Charge events: "N% more cans for charges between start_at and end_at" (SPEC W3, seed 003),
-- created and switched off by ops.
--
-- An event is active for a completion when is_active = 1 and the completion falls inside
-- [start_at, end_at]; the newest started one applies (one event bonus per charge). A member
-- gets at most available_count of its bonuses: the completion counts the member's EVENT
-- charges with the event's title inside the window (getPaymentCount) plus the member's
-- bonus jobs of this event still owed (not DONE), under the member's row lock.
--
-- Retries never read this table: a bonus job carries its own snapshot (additional_can,
-- method_snapshot), so editing or ending an event changes nothing already owed.
CREATE TABLE charge_events (
    id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    -- Also the bonus's reason: the EVENT charge's method (the job's method_snapshot).
    title            VARCHAR(100)    NOT NULL,
    -- Bonus cans = floor(cans * add_percent / 100).
    add_percent      INT             NOT NULL,
    start_at         TIMESTAMP(6)    NOT NULL,
    end_at           TIMESTAMP(6)    NOT NULL,
    is_active        TINYINT(1)      NOT NULL DEFAULT 1,
    -- Bonuses of this event per member.
    available_count  INT             NOT NULL DEFAULT 1,
    created_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- The completion's "which event is active now".
    KEY index_charge_events_active (is_active, start_at),
    CONSTRAINT ck_charge_events_add_percent CHECK (add_percent BETWEEN 1 AND 1000),
    CONSTRAINT ck_charge_events_window CHECK (end_at > start_at),
    CONSTRAINT ck_charge_events_available_count CHECK (available_count >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
