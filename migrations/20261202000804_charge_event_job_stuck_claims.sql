-- The stuck-rows gauge (`/metrics`, the overview) counts PROCESSING jobs whose claim is
-- older than the lease; without an index on the claim's time that count read every
-- PROCESSING row (a second at a million jobs, on every scrape).
ALTER TABLE charge_event_job
    ADD KEY idx_charge_event_job_stuck_claims (status, processing_started_at);
