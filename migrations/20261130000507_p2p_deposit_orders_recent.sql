-- The continuous auditor's window over buyers' orders (W1's p2p_deposit_fills check: the
-- deposit orders changed since an instant).
CREATE INDEX index_p2p_deposit_orders_recent ON p2p_deposit_orders (updated_at);
