-- The continuous auditor's window over cancel tasks (W4's cancel_tasks check: the tasks
-- created or settled since an instant, and through them their batches).
CREATE INDEX index_tasks_recent ON tasks (updated_at);
