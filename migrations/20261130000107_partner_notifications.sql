-- Partner notifications: webhooks owed to partners (SPEC W2, principle 8), one row per
-- (event, reference) — uk_partner_notifications_event_reference is the last line of defence
-- against a second WITHDRAWAL_CONFIRMED (seed 001: notifications 7307 and 7309).
--
-- status:
--   PENDING    inserted (next_attempt_at = now) in the same transaction as the transition that
--              owes it (e.g. confirm-withdrawal), with a `partner.notification.created` outbox
--              message. deliver-webhook claims a due row by a conditional UPDATE that counts the
--              attempt and pushes next_attempt_at out (a lease), POSTs with no transaction
--              open, then settles: after a failure below the attempt limit it stays PENDING with
--              last_error and next_attempt_at = the backoff.
--   DELIVERED  terminal. PENDING -> DELIVERED by deliver-webhook after a 2xx (delivered_at).
--   SKIPPED    terminal. PENDING -> SKIPPED by deliver-webhook when the partner has no
--              webhook_url: nothing to send is not a failure.
--   FAILED     PENDING -> FAILED by deliver-webhook at the attempt limit (with a dead letter).
--              FAILED -> PENDING only by ops (retry).
CREATE TABLE partner_notifications (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id      BIGINT UNSIGNED NOT NULL,
    event           VARCHAR(64)     NOT NULL,
    reference_type  VARCHAR(32)     NOT NULL,
    reference_id    BIGINT UNSIGNED NOT NULL,
    -- The JSON body as sent, frozen when the transition happened.
    payload         MEDIUMTEXT      NOT NULL,
    status          VARCHAR(16)     NOT NULL DEFAULT 'PENDING',
    attempts        INT UNSIGNED    NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMP(6)    NULL DEFAULT CURRENT_TIMESTAMP(6),
    last_error      VARCHAR(2000)   NULL,
    delivered_at    TIMESTAMP(6)    NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_partner_notifications_event_reference (event, reference_type, reference_id),
    -- deliver-webhook's poll for due rows.
    KEY index_partner_notifications_due (status, next_attempt_at),
    KEY index_partner_notifications_by_partner (partner_id, created_at),
    CONSTRAINT fk_partner_notifications_partner FOREIGN KEY (partner_id) REFERENCES partners (id),
    CONSTRAINT ck_partner_notifications_status
        CHECK (status IN ('PENDING', 'DELIVERED', 'SKIPPED', 'FAILED')),
    CONSTRAINT ck_partner_notifications_delivered
        CHECK (status <> 'DELIVERED' OR delivered_at IS NOT NULL)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
