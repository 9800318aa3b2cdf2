-- Charge-event bonus jobs (SPEC W3, seed 003): the seed's DDL, with these adaptations:
--   * ids are BIGINT UNSIGNED, as in every paybus table: a foreign key needs the referenced
--     column's exact type, and the retry kit and the messages carry ids as u64.
--   * the referenced tables are paybus's members, charges and charge_events (the seed's
--     member, charge, charge_event).
--   * every TIMESTAMP is TIMESTAMP(6): the status lease's guard compares
--     processing_started_at exactly, so two claims within one second must differ; and times
--     are UTC with microseconds everywhere (SPEC principle 11). Defaults and ON UPDATE follow
--     (CURRENT_TIMESTAMP(6)).
--   * the collation is named (utf8mb4_unicode_ci, as every paybus table): with the server's
--     default (utf8mb4_general_ci on MariaDB, utf8mb4_0900_ai_ci on MySQL 8) comparing these
--     columns with the charges' (the audit's joins) is an "illegal mix of collations" error.
--   * CHECK constraints (ck_*) state the states' invariants; columns, keys and index names are
--     the seed's.
--
-- status (the retry kit's status lease, `paybus_bonuses::job::BONUS_JOBS`):
--   PENDING     inserted (next_retry_at NULL: due now) by the payment completion, in the
--               transaction that completes the charge, with a `charge.bonus_job.created`
--               message. Back to PENDING after a failed attempt (last_error, next_retry_at =
--               now + 5 min after the first failure, + 10 and + 15 min after the 1st and 2nd
--               failed retry, retry_count counting failed retries), by the reaper when its
--               PROCESSING claim is older than the timeout (the process died), and by ops'
--               retry of a FAILED job (next_retry_at = now, a message published at once).
--   PROCESSING  PENDING -> PROCESSING by a claim (a conditional UPDATE stamping
--               processing_started_at): grant-bonus on the message (the immediate attempt),
--               or the worker (every 5 min, 30 due jobs, FOR UPDATE SKIP LOCKED). Nobody else
--               touches a PROCESSING row; every settle is guarded by its stamp.
--   DONE        terminal. PROCESSING -> DONE by grant-bonus in the transaction that locks the
--               member, inserts the EVENT charge (result_charge_id) and credits its cans.
--   FAILED      PROCESSING -> FAILED when the 3rd retry fails (retry_count 3), with a dead
--               letter; no automatic retry. FAILED -> PENDING only by ops (admin API, CLI).
CREATE TABLE charge_event_job
(
    id                   BIGINT UNSIGNED NOT NULL AUTO_INCREMENT COMMENT 'PK',
    source_charge_id     BIGINT UNSIGNED NOT NULL COMMENT '이벤트 보너스 지급의 기준이 되는 원본 충전 ID(charge.id)',
    result_charge_id     BIGINT UNSIGNED NULL COMMENT '이벤트 보너스로 생성된 Charge ID(charge.id)',
    member_id            BIGINT UNSIGNED NOT NULL COMMENT '이벤트 보너스를 지급받을 회원 ID(member.id)',
    charge_event_id      BIGINT UNSIGNED NULL COMMENT '적용된 충전 이벤트 ID(charge_event.id), 첫 충전 이벤트처럼 별도 이벤트 row가 없으면 NULL',
    job_type             VARCHAR(30)  NOT NULL COMMENT '작업 유형(FIRST_CHARGE, ACTIVE_CHARGE_EVENT)',
    idempotency_key      VARCHAR(100) NOT NULL COMMENT '중복 작업 방지 키(예: charge-event:{sourceChargeId}:{jobType}:{chargeEventId 또는 none})',
    additional_can       INT          NOT NULL COMMENT '추가 지급할 보너스 캔 수',
    payment_gateway      VARCHAR(30)  NOT NULL COMMENT '원본 충전의 결제 게이트웨이(PG, PAYVERSE, GOOGLE_IAP, APPLE_IAP 등)',
    container            VARCHAR(10)  NOT NULL COMMENT '회원 캔 잔액 반영 대상(pg, aos, ios)',
    method_snapshot      VARCHAR(100) NOT NULL COMMENT '이벤트 보너스 Charge.payment.method에 기록할 지급 사유 스냅샷',
    status               VARCHAR(20)  NOT NULL DEFAULT 'PENDING' COMMENT '작업 상태(PENDING, PROCESSING, DONE, FAILED)',
    retry_count          INT          NOT NULL DEFAULT 0 COMMENT '재시도 횟수',
    next_retry_at        TIMESTAMP(6) NULL DEFAULT NULL COMMENT '다음 재시도 가능 시각',
    processing_started_at TIMESTAMP(6) NULL DEFAULT NULL COMMENT 'PROCESSING 상태로 선점한 시각',
    processed_at         TIMESTAMP(6) NULL DEFAULT NULL COMMENT '지급 성공 처리 시각',
    last_error           TEXT         NULL COMMENT '마지막 실패 사유',
    created_at           TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT '생성 시각',
    updated_at           TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6) COMMENT '수정 시각',
    PRIMARY KEY (id),
    -- The last line of defence behind the completion's transition: one job per (charge, type,
    -- event).
    UNIQUE KEY uk_charge_event_job_idempotency_key (idempotency_key),
    -- The claims of due jobs (status = 'PENDING' AND next_retry_at due), the reaper's
    -- PROCESSING scan, the admin list by status.
    KEY idx_charge_event_job_status_next_retry_at (status, next_retry_at),
    -- A repeated completion's original result (the charge's jobs).
    KEY idx_charge_event_job_source_charge_id (source_charge_id),
    KEY idx_charge_event_job_result_charge_id (result_charge_id),
    -- The per-member limit's count of owed jobs.
    KEY idx_charge_event_job_member_id (member_id),
    KEY idx_charge_event_job_charge_event_id (charge_event_id),
    CONSTRAINT fk_charge_event_job_source_charge_id
        FOREIGN KEY (source_charge_id) REFERENCES charges (id),
    CONSTRAINT fk_charge_event_job_result_charge_id
        FOREIGN KEY (result_charge_id) REFERENCES charges (id),
    CONSTRAINT fk_charge_event_job_member_id
        FOREIGN KEY (member_id) REFERENCES members (id),
    CONSTRAINT fk_charge_event_job_charge_event_id
        FOREIGN KEY (charge_event_id) REFERENCES charge_events (id),
    CONSTRAINT ck_charge_event_job_status
        CHECK (status IN ('PENDING', 'PROCESSING', 'DONE', 'FAILED')),
    CONSTRAINT ck_charge_event_job_type
        CHECK (job_type IN ('FIRST_CHARGE', 'ACTIVE_CHARGE_EVENT')),
    CONSTRAINT ck_charge_event_job_event
        CHECK (job_type <> 'ACTIVE_CHARGE_EVENT' OR charge_event_id IS NOT NULL),
    CONSTRAINT ck_charge_event_job_additional_can CHECK (additional_can > 0),
    CONSTRAINT ck_charge_event_job_retry_count CHECK (retry_count >= 0),
    CONSTRAINT ck_charge_event_job_container CHECK (container IN ('pg', 'aos', 'ios')),
    CONSTRAINT ck_charge_event_job_processing
        CHECK (status <> 'PROCESSING' OR processing_started_at IS NOT NULL),
    CONSTRAINT ck_charge_event_job_done
        CHECK (status <> 'DONE' OR (result_charge_id IS NOT NULL AND processed_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci COMMENT='충전 이벤트 보너스 지급 작업';
