-- The continuous auditor's window over deposits (W2's deposit_entries check: the deposits
-- changed since an instant). A deposit is updated about twice in its life (DETECTED, then
-- CONFIRMED or FAILED), so the index costs little on writes.
CREATE INDEX index_deposits_recent ON deposits (updated_at);
