-- The continuous auditor's window over matches (W1's checks: the matches reserved, confirmed
-- or released since an instant, and through them their orders and settlement entries).
CREATE INDEX index_p2p_matches_recent ON p2p_matches (updated_at);
