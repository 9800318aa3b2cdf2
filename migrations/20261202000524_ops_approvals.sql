-- Four-eyes for single ops actions that move money (paybus_platform::approvals): retrying a
-- FAILED bonus job, re-running a suspension's FAILED tasks, resuming a market. One person
-- requests, another approves, then it runs; dead-letter replays and archives are approved as
-- their operation instead (dead_letter_operations).
--
-- status: AWAITING_APPROVAL → APPROVED → EXECUTED. expires_at bounds both steps: an approval
-- not given, or an approved action not run, before it is void.
CREATE TABLE ops_approvals (
    id              CHAR(36)        NOT NULL,
    action          VARCHAR(32)     NOT NULL,
    -- What it acts on, kind:id (charge_event_job:42, market:BTC-USDT).
    subject         VARCHAR(200)    NOT NULL,
    status          VARCHAR(24)     NOT NULL,
    requested_by    VARCHAR(100)    NOT NULL,
    requested_at    TIMESTAMP(6)    NOT NULL,
    expires_at      TIMESTAMP(6)    NOT NULL,
    approved_by     VARCHAR(100)    NULL,
    approved_at     TIMESTAMP(6)    NULL,
    executed_by     VARCHAR(100)    NULL,
    executed_at     TIMESTAMP(6)    NULL,
    -- What the action reported when it ran.
    result          VARCHAR(1000)   NULL,
    PRIMARY KEY (id),
    -- A second request for the same action and subject finds the one waiting.
    KEY index_ops_approvals_pending (action, subject, status),
    KEY index_ops_approvals_recent (requested_at),
    CONSTRAINT ck_ops_approvals_status
        CHECK (status IN ('AWAITING_APPROVAL', 'APPROVED', 'EXECUTED'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
