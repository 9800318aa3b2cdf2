-- The continuous auditor's window over charges (W3's checks: the charges requested, completed
-- or granted since an instant, and through them their members and bonus jobs).
CREATE INDEX index_charges_recent ON charges (updated_at);
