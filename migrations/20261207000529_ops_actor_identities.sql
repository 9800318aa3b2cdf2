-- Who acted, as the identity provider vouches for them (paybus_platform::actor): a person is
-- (issuer, subject), not a name anyone can type. The ops log's `actor` and the requests'
-- `*_by` stay the names people read; these columns say who that was and how they proved it.
--
-- ops_log: NULL on rows written before (their hash, `paybus.ops_log.v1`, covers no identity);
-- a row with an issuer is hashed as `paybus.ops_log.v2`, over these columns too.
-- ops_approvals, dead_letter_operations: four-eyes compares the requester's and the approver's
-- (issuer, subject); a request written before has none, and can no longer be approved.
--
-- Nullable columns at the end: metadata only, no rebuild, no lock (INSTANT, without a LOCK
-- clause, which MySQL 8 refuses beside it).
ALTER TABLE ops_log
    ADD COLUMN actor_issuer VARCHAR(255) NULL,
    ADD COLUMN actor_subject VARCHAR(255) NULL,
    ADD COLUMN auth_method VARCHAR(16) NULL,
    ALGORITHM = INSTANT;

ALTER TABLE ops_approvals
    ADD COLUMN requested_by_issuer VARCHAR(255) NULL,
    ADD COLUMN requested_by_subject VARCHAR(255) NULL,
    ADD COLUMN approved_by_issuer VARCHAR(255) NULL,
    ADD COLUMN approved_by_subject VARCHAR(255) NULL,
    ALGORITHM = INSTANT;

ALTER TABLE dead_letter_operations
    ADD COLUMN requested_by_issuer VARCHAR(255) NULL,
    ADD COLUMN requested_by_subject VARCHAR(255) NULL,
    ADD COLUMN approved_by_issuer VARCHAR(255) NULL,
    ADD COLUMN approved_by_subject VARCHAR(255) NULL,
    ALGORITHM = INSTANT;
