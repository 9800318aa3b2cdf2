-- When a partner's webhook breaker opened (deliver-webhook, paybus_partners::breaker): set by
-- the failure that opens it, kept while probes fail, cleared with the breaker by a delivered
-- POST. webhook_open_until says when the next probe may go; this says since when the partner
-- has been cut off, which is what ops ask first (the console's partner pages).
ALTER TABLE partners
    ADD COLUMN webhook_opened_at TIMESTAMP(6) NULL,
    ALGORITHM=INSTANT;
