-- The continuous auditor's passes (a sweeper job): one row per pass, what it checked and what
-- it found. Append-only, inserted by the auditor when a pass ends; the auditor deletes passes
-- older than its retention (index_audit_passes_for_prune). No state machine.
CREATE TABLE audit_passes (
    id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    started_at     TIMESTAMP(6)    NOT NULL,
    finished_at    TIMESTAMP(6)    NOT NULL,
    -- The pass looked at rows written since this instant (windowed checks); NULL: everything.
    window_since   TIMESTAMP(6)    NULL,
    checks         INT UNSIGNED    NOT NULL,
    violations     INT UNSIGNED    NOT NULL,
    duration_ms    BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (id),
    KEY index_audit_passes_for_prune (started_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
