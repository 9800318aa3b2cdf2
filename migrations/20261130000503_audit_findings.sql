-- Violations the continuous auditor found, one row per distinct violation (fingerprint: the
-- check and its one-line description), upserted by every pass that finds it again. What the
-- admin API and the console show as the audit status. No state machine: a finding whose
-- last_pass_id is older than the latest pass is no longer found.
CREATE TABLE audit_findings (
    id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    fingerprint    CHAR(64)        NOT NULL,
    check_name     VARCHAR(64)     NOT NULL,
    description    VARCHAR(2000)   NOT NULL,
    detail         TEXT            NOT NULL,
    first_seen_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_seen_at   TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    times_seen     INT UNSIGNED    NOT NULL DEFAULT 1,
    last_pass_id   BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_audit_findings_fingerprint (fingerprint),
    -- The admin list: most recently seen first.
    KEY index_audit_findings_recent (last_seen_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
