-- The money-at-stake scan pages through the NEW letters oldest first (status = 'NEW' AND
-- id > ? ORDER BY id). Its secondary index ends with the primary key, so this one index
-- serves it in order; without it the scan walked the primary key and skipped every letter
-- already dealt with (nine in ten in a long-lived table).
ALTER TABLE dead_letters ADD KEY index_dead_letters_new_in_order (status);
