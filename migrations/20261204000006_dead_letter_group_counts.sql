-- The NEW dead letters counted per group (function, reason): how many letters and the
-- failures they stand for, what the groups page, the API and `paybus dead-letters groups`
-- show. Counting them on every view was a GROUP BY over every NEW letter (0.3-0.6 s at
-- 500,000 NEW letters). Every write that moves a letter into or out of NEW changes these
-- counts in its own transaction (paybus_platform::bus::dead_letter::group_counts: recorded,
-- failed again, reopened, replayed, archived), so they are exact, never an estimate.
--
-- A group is spread over a few slots (the writer's connection id picks one) summed on read:
-- a storm of failures of one function and reason does not queue every recorder behind one
-- row lock. A slot's figures may go below zero (a letter counted in one slot leaves through
-- another); only their sum means anything.
CREATE TABLE dead_letter_group_counts (
    function_name   VARCHAR(64)     NOT NULL,
    reason          VARCHAR(64)     NOT NULL,
    slot            TINYINT UNSIGNED NOT NULL,
    letters         BIGINT          NOT NULL DEFAULT 0,
    failures        BIGINT          NOT NULL DEFAULT 0,
    PRIMARY KEY (function_name, reason, slot)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- The letters already there, counted once, here: an index-only read of the NEW letters
-- (index_dead_letters_groups), well under a second at 500,000 NEW letters, during which new
-- NEW letters wait (the read share-locks what it counts). Letters written after it by a
-- paybus that predates this table are not counted: the audit check
-- `dead_letter_group_counts` finds that and `paybus dead-letters recount` sets it right.
INSERT INTO dead_letter_group_counts (function_name, reason, slot, letters, failures)
SELECT function_name, reason, 0, COUNT(*), SUM(failures)
FROM dead_letters
WHERE status = 'NEW'
GROUP BY function_name, reason;
