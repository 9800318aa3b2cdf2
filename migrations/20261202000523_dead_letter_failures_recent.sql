-- The ops overview counts each function's failures of the last hour: by time, without reading
-- every failure ever recorded.
ALTER TABLE dead_letter_failures ADD KEY index_dead_letter_failures_recent (failed_at);
