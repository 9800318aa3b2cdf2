-- The dead-letter groups (console, API, CLI) and the NEW counts of `/metrics` and the
-- overview: the (function, reason) pairs by a skip over this index's distinct prefixes,
-- each group's capped count and failures and its first and last failure read from the
-- two indexes alone. Without them every view read every NEW letter's row (seconds at a
-- million letters).
ALTER TABLE dead_letters
    ADD KEY index_dead_letters_groups
        (status, function_name, reason, failed_at, last_failed_at, failures),
    ADD KEY index_dead_letters_groups_last (status, function_name, reason, last_failed_at);
