-- One row per POST deliver-webhook made to a partner (never for a delivery it parked or
-- deferred without sending): when it started, the HTTP status (NULL when no answer came: a
-- timeout, a refused connection), how long it took, and the error of a failed one. The
-- partner API shows them (paybus_partners::attempts::of_notification). `attempt` is the
-- notification's attempt number at the time; a re-delivery starts it again at 1, so rows are
-- ordered by id.
--
-- Written on the settle's connection, right before the settle. Pruned by deliver-webhook's
-- `prune-attempts` job once older than its retention (30 days by default).
CREATE TABLE partner_notification_attempts (
    id              BIGINT UNSIGNED   NOT NULL AUTO_INCREMENT,
    notification_id BIGINT UNSIGNED   NOT NULL,
    partner_id      BIGINT UNSIGNED   NOT NULL,
    attempt         INT UNSIGNED      NOT NULL,
    started_at      TIMESTAMP(6)      NOT NULL,
    status_code     SMALLINT UNSIGNED NULL,
    latency_ms      INT UNSIGNED      NOT NULL,
    error           VARCHAR(2000)     NULL,
    created_at      TIMESTAMP(6)      NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- "The attempts of notification N for partner P", partner first (the partner API's
    -- isolation is in the WHERE).
    KEY index_partner_notification_attempts_of_notification (partner_id, notification_id, id),
    KEY index_partner_notification_attempts_for_prune (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- The partner API's newest-first pages of a partner's notifications (`WHERE partner_id = ?
-- AND id < ? ORDER BY id DESC`): index_partner_notifications_by_partner orders by created_at,
-- whose ties would need a sort.
ALTER TABLE partner_notifications
    ADD KEY index_partner_notifications_for_partner (partner_id, id);
