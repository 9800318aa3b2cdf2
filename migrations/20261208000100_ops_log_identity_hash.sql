-- The hash of a row's identity (paybus_ops::ops_log::identity_hash): SHA-256 over the row's
-- row_hash and its actor_issuer, actor_subject and auth_method. A row with an identity keeps
-- the row_hash the previous release computes (`paybus.ops_log.v1`, which covers no identity),
-- so that release's auditor, still running during a rolling or canary deploy and after a
-- rollback, verifies the rows this one writes; this column makes an identity changed after the
-- row was written visible to this release's. NULL on rows without an identity.
--
-- A nullable column at the end: metadata only, no rebuild, no lock (INSTANT, without a LOCK
-- clause, which MySQL 8 refuses beside it).
ALTER TABLE ops_log
    ADD COLUMN identity_hash CHAR(64) NULL,
    ALGORITHM = INSTANT;
