-- The continuous auditor's window over bonus jobs (W3's bonus_job_results check: the jobs that
-- changed state since an instant).
CREATE INDEX index_charge_event_job_recent ON charge_event_job (updated_at);
