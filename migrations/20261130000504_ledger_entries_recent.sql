-- The continuous auditor's window over the ledger (entries written since an instant): without
-- it every pass would scan the whole append-only table. Appends at the index's right edge.
CREATE INDEX index_ledger_entries_recent ON ledger_entries (created_at);
