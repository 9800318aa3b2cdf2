-- Operations on dead letters (docs/operations.md): a dry run that is bound to what it showed.
--
-- Before this, a group replay or archive selected the group again when it ran, so letters that
-- arrived between the dry run and the click were acted on unseen. Now the dry run freezes an
-- operation: its letters with the verdict each had (dead_letter_operation_letters), a hash of
-- that list, an expiry. Executing it acts on those letters only, each once (its row's result is
-- written in the transaction that acts, under the row's lock), so executing it twice or from
-- two places at once acts once, and a process that dies mid-way leaves the rest to the next
-- execution.
--
-- status: AWAITING_APPROVAL (four-eyes: a second ADMIN must approve the hash) → READY →
-- RUNNING (started; resumable after its expiry) → DONE. An operation not started before
-- expires_at is never started (it shows as expired).
CREATE TABLE dead_letter_operations (
    id                CHAR(36)        NOT NULL,
    action            VARCHAR(16)     NOT NULL,
    -- How the requester chose the letters (JSON: ids or a group), for the record.
    selection         VARCHAR(1000)   NOT NULL,
    letters           INT UNSIGNED    NOT NULL,
    -- Of them, letters the dry run found with money at stake (what makes an archive need
    -- approval).
    letters_with_money INT UNSIGNED   NOT NULL,
    content_hash      CHAR(64)        NOT NULL,
    status            VARCHAR(24)     NOT NULL,
    approval_required TINYINT(1)      NOT NULL,
    requested_by      VARCHAR(100)    NOT NULL,
    requested_at      TIMESTAMP(6)    NOT NULL,
    expires_at        TIMESTAMP(6)    NOT NULL,
    approved_by       VARCHAR(100)    NULL,
    approved_at       TIMESTAMP(6)    NULL,
    executed_by       VARCHAR(100)    NULL,
    started_at        TIMESTAMP(6)    NULL,
    finished_at       TIMESTAMP(6)    NULL,
    done              INT UNSIGNED    NOT NULL DEFAULT 0,
    PRIMARY KEY (id),
    KEY index_dead_letter_operations_recent (requested_at),
    CONSTRAINT ck_dead_letter_operations_action CHECK (action IN ('REPLAY', 'ARCHIVE')),
    CONSTRAINT ck_dead_letter_operations_status
        CHECK (status IN ('AWAITING_APPROVAL', 'READY', 'RUNNING', 'DONE'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE dead_letter_operation_letters (
    operation_id    CHAR(36)        NOT NULL,
    dead_letter_id  BIGINT UNSIGNED NOT NULL,
    -- The verdict the dry run showed (what was approved): a replay sends only letters that
    -- were safe then and are safe again under the letter's lock.
    verdict         VARCHAR(16)     NOT NULL,
    reason          VARCHAR(1000)   NOT NULL DEFAULT '',
    -- NULL until the operation acted on it: REPLAYED, NOT_SENT, ARCHIVED or SKIPPED.
    result          VARCHAR(16)     NULL,
    detail          VARCHAR(1000)   NOT NULL DEFAULT '',
    done_at         TIMESTAMP(6)    NULL,
    PRIMARY KEY (operation_id, dead_letter_id),
    KEY index_dead_letter_operation_letters_by_letter (dead_letter_id),
    CONSTRAINT fk_dead_letter_operation_letters_operation
        FOREIGN KEY (operation_id) REFERENCES dead_letter_operations (id),
    CONSTRAINT fk_dead_letter_operation_letters_letter
        FOREIGN KEY (dead_letter_id) REFERENCES dead_letters (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- A letter's trail names the operation an action belonged to (NULL before operations).
ALTER TABLE dead_letter_actions ADD COLUMN operation_id CHAR(36) NULL;
