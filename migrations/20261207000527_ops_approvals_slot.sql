-- One open request per (action, subject) for four-eyes approvals (paybus_platform::approvals).
--
-- pending_slot: 1 while an approval is the open request for its (action, subject) — awaiting
-- approval or approved, not executed, not found expired — NULL otherwise. The unique key
-- makes the database, not a read before the insert, decide that asking twice (or six times
-- at once) is one request: MySQL and MariaDB have no partial unique index, and a NULL never
-- collides, so only open requests compete for the key. Expiry is time-based and cannot live
-- in a generated column: the code frees an expired holder's slot when it finds one.
--
-- Existing rows may hold several open requests per (action, subject), made by concurrent
-- requests before the key: the approved one (else the oldest awaiting one) takes the slot;
-- the others stay without it, so they can be neither approved nor executed, and collide
-- with nothing.
--
-- Built online: the server must refuse rather than copy the table under a lock.
ALTER TABLE ops_approvals
    ADD COLUMN pending_slot TINYINT UNSIGNED NULL,
    ADD UNIQUE KEY uk_ops_approvals_pending_slot (action, subject, pending_slot),
    ALGORITHM = INPLACE, LOCK = NONE;

UPDATE ops_approvals
JOIN (
    SELECT id FROM (
        SELECT id, ROW_NUMBER() OVER (
            PARTITION BY action, subject
            ORDER BY status = 'APPROVED' DESC, requested_at, id
        ) AS rank_in_subject
        FROM ops_approvals
        WHERE status IN ('AWAITING_APPROVAL', 'APPROVED') AND expires_at > NOW(6)
    ) AS ranked
    WHERE rank_in_subject = 1
) AS open_request ON open_request.id = ops_approvals.id
SET ops_approvals.pending_slot = 1;
