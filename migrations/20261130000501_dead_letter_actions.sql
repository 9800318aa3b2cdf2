-- What ops did to dead letters (`paybus dead-letters`, the admin API): one row per letter per
-- replay or archive, written in the transaction that acts on the letter, so the trail and the
-- letter's status never disagree. Append-only: no state machine.
--
-- action:  REPLAY (dry-run verdict SAFE: the message was re-sent through the outbox and the
--          letter moved NEW -> REPLAYED) or ARCHIVE (NEW -> ARCHIVED).
-- verdict: the function's triage at the moment of the action (already_applied, safe,
--          needs_human); a replay that found anything but `safe` sent nothing.
-- result:  REPLAYED (sent, replay_message_id set), NOT_SENT (the verdict was not safe, the
--          letter stays NEW), ARCHIVED, or SKIPPED (the letter was no longer NEW).
CREATE TABLE dead_letter_actions (
    id                BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    dead_letter_id    BIGINT UNSIGNED NOT NULL,
    action            VARCHAR(16)     NOT NULL,
    actor             VARCHAR(100)    NOT NULL,
    verdict           VARCHAR(16)     NULL,
    result            VARCHAR(16)     NOT NULL,
    detail            VARCHAR(1000)   NOT NULL DEFAULT '',
    replay_message_id CHAR(36)        NULL,
    created_at        TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- A letter's history, newest last (the show view).
    KEY index_dead_letter_actions_by_letter (dead_letter_id, id),
    CONSTRAINT fk_dead_letter_actions_letter FOREIGN KEY (dead_letter_id) REFERENCES dead_letters (id),
    CONSTRAINT ck_dead_letter_actions_action CHECK (action IN ('REPLAY', 'ARCHIVE')),
    CONSTRAINT ck_dead_letter_actions_result
        CHECK (result IN ('REPLAYED', 'NOT_SENT', 'ARCHIVED', 'SKIPPED')),
    CONSTRAINT ck_dead_letter_actions_replayed
        CHECK (result <> 'REPLAYED' OR replay_message_id IS NOT NULL)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
