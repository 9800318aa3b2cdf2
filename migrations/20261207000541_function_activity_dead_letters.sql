-- Dead letters recorded per function and minute (paybus_platform::bus::activity, counted by the
-- recorder as it records each new failure): the console's dead letters per hour read these
-- counters instead of a day of dead_letter_failures joined to their letters.
ALTER TABLE function_activity
    ADD COLUMN dead_letters BIGINT UNSIGNED NOT NULL DEFAULT 0,
    ALGORITHM=INSTANT;
