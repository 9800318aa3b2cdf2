-- The completion's per-member limit counts the member's jobs of the event that applies now
-- (`j.member_id = ? AND j.charge_event_id = ? AND j.status <> 'DONE'`, under the member's row
-- lock). With one index on member_id and another on charge_event_id, MariaDB intersected the
-- two: it read every job of the event — 44 ms a completion for a member with 2,000 past jobs
-- in an event of 207,000 (docs/benchmarks.md, 2026-12-05, evening), growing with the event.
-- With member_id alone it read the member's whole history. On (member_id, charge_event_id) it
-- reads the member's jobs of this one event, which its limit (`available_count`) bounds.
--
-- The new index starts with member_id, so it also serves the foreign key
-- fk_charge_event_job_member_id, and the seed's single-column index goes: one index per
-- job insert, as before.
CREATE INDEX idx_charge_event_job_member_event ON charge_event_job (member_id, charge_event_id);
DROP INDEX idx_charge_event_job_member_id ON charge_event_job;
