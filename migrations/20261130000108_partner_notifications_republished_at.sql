-- The retry kit's arming column for the due sweep (platform retry kit, `WorkTable`):
--   NULL      armed: deliver-webhook pushed next_attempt_at out (a claim's lease, a retry's
--             backoff) and no message has been sent for that due time yet; once due, the
--             sweep re-publishes the row and stamps this column.
--   a time    when the row's last message was sent (its transition's, or the sweep's); a due
--             row stamped longer than the sweep's stale_after ago is re-published again.
-- Replaces the `updated_at < next_attempt_at` comparison, which mixed the database's clock
-- (ON UPDATE) with the kit's clock.
ALTER TABLE partner_notifications
    ADD COLUMN republished_at TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6) AFTER next_attempt_at;

-- Rows armed under the old rule stay armed.
UPDATE partner_notifications
SET republished_at = NULL
WHERE status = 'PENDING' AND updated_at < next_attempt_at;
