-- A partner endpoint that answered 410 Gone is disabled (Svix's convention: the endpoint says
-- it is gone for good), by deliver-webhook:
--   webhook_disabled_at      NULL: enabled. A time: since when its deliveries are parked —
--                            they stay PENDING, not attempted, no attempt counted, like an
--                            open breaker, but with no probe: nothing is sent until ops set
--                            the URL again (paybus_partners::partner::set_webhook_url), which
--                            clears both columns and makes the parked notifications due.
--   webhook_disabled_reason  what disabled it (e.g. `HTTP 410 Gone from the endpoint`).
ALTER TABLE partners
    ADD COLUMN webhook_disabled_at     TIMESTAMP(6)  NULL,
    ADD COLUMN webhook_disabled_reason VARCHAR(255)  NULL;
