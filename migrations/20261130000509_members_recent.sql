-- The continuous auditor's window over members (W3's member_can_balances check: the members
-- whose balances changed since an instant).
CREATE INDEX index_members_recent ON members (updated_at);
