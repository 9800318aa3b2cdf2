-- The per-partner circuit breaker of webhook delivery (deliver-webhook): one hanging or broken
-- endpoint must not hold every partner's webhooks (black-box testing: 80 hanging deliveries
-- delayed a healthy partner's by 10-13 s at every retry round).
--
-- webhook_failures     consecutive failed POSTs to this partner; reset by a delivered one.
-- webhook_open_until   NULL: closed, deliveries are attempted.
--                      in the future: open, due deliveries are parked until then (not
--                      attempted, no attempt counted).
--                      in the past: half-open, the next delivery is the probe: it claims the
--                      probe by pushing this forward one cool-down (a conditional UPDATE, so
--                      one probe at a time); success closes, failure keeps it open.
ALTER TABLE partners
    ADD COLUMN webhook_failures   INT UNSIGNED NOT NULL DEFAULT 0,
    ADD COLUMN webhook_open_until TIMESTAMP(6) NULL;
