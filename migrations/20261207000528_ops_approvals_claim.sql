-- An execution of a four-eyes approval claims it before it runs the action
-- (paybus_platform::approvals::claim): a conditional UPDATE setting claim_token and
-- claimed_at, which one concurrent execution wins; the others wait for the result it records.
-- A claim older than the lease (60 s) belongs to a process that died before recording, and
-- may be taken over.
--
-- Two nullable columns at the end: metadata only, no rebuild and no lock. INSTANT alone: the
-- server refuses the ALTER if it cannot do it so, and MySQL 8 rejects any LOCK clause beside
-- INSTANT (error 1221).
ALTER TABLE ops_approvals
    ADD COLUMN claim_token CHAR(36) NULL,
    ADD COLUMN claimed_at TIMESTAMP(6) NULL,
    ALGORITHM = INSTANT;
