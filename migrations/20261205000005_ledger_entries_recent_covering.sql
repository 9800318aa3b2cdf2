-- The windowed deposit and withdrawal checks find the deposits and withdrawals the window's
-- ledger entries name (`created_at >= ? AND reference_type = ?`, then `reference_id`). On
-- (created_at) alone every entry of the window was read as a row to test its type: 20 ms for
-- a 4-minute window of 16,000 entries on the 12-minute soak's database, most of a check's
-- time; with both columns in the index, 6.7 ms from the index alone (docs/benchmarks.md,
-- 2026-12-05, night). The ledger's own windowed checks read the same prefix.
--
-- One ALTER, so that the index the checks force is never missing (a FORCE INDEX naming a
-- missing index is an error, for any process still running during the migration). The same
-- index entry per posting as before, about 20 bytes wider.
ALTER TABLE ledger_entries
    DROP INDEX index_ledger_entries_recent,
    ADD INDEX index_ledger_entries_recent (created_at, reference_type, reference_id);
