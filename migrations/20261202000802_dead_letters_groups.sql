-- The dead-letter groups (console, API, CLI) and the NEW counts of `/metrics` and the
-- overview: the GROUP BY of the NEW letters by function and reason (count, failures, first
-- and last failure) and the distinct functions' capped counts, read from this index alone.
-- Without it every view read every NEW letter's row (seconds at a million letters).
ALTER TABLE dead_letters
    ADD KEY index_dead_letters_groups
        (status, function_name, reason, failed_at, last_failed_at, failures);
