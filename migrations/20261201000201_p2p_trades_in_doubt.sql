-- W1's trades in doubt (principle 12: a createTrade whose outcome is unknown is never treated as
-- failed). Amends p2p_matches and p2p_deposit_orders (their first migrations describe the
-- other states; they cannot be edited once applied).
--
-- p2p_matches.status gains TRADING, between RESERVED and CONFIRMED:
--   RESERVED   as before; released only while createTrade was never sent for it.
--   TRADING    RESERVED -> TRADING by the attempt, in one guarded UPDATE committed *before*
--              createTrade is sent (quote_id, rate and fee of the quote, trade_sent_at). From
--              here the trade may exist at the quote service under trade_key, so the liquidity
--              stays held (the withdraw order's reserved_amount) until a definitive answer:
--              TRADING -> CONFIRMED by the settlement of the trade the service answered with
--              (the first call, or a later one under the same key and the same body);
--              TRADING -> RELEASED (TRADE_REFUSED) only on a definitive refusal (a 4xx other
--              than 408/409/425). A timeout, a reset, a 5xx, an answer that does not parse or a
--              crash leaves it TRADING: the reaper, expiry, outcome accounting and a close never
--              release it. trade_checks counts the calls whose outcome stayed unknown, and
--              last_trade_error says why.
--
-- p2p_deposit_orders.status gains IN_DOUBT (not terminal):
--   IN_DOUBT   MATCHING -> IN_DOUBT by outcome accounting when one of its fills is still TRADING
--              after PAYBUS_MATCH_TRADE_CHECKS calls (asking stopped): a trade may exist at the
--              quote service under the fill's key; with a dead letter (needs a human). Never
--              claimed, reaped or expired. IN_DOUBT -> PENDING by `paybus p2p recheck` (ops,
--              after looking at the quote service), which asks again under the same key.
--   Until then an order whose fill is TRADING waits PENDING (its next attempt asks again
--   first, before anything else), uncounted.
ALTER TABLE p2p_matches
    ADD COLUMN quote_id VARCHAR(128) NULL AFTER trade_key,
    ADD COLUMN trade_sent_at TIMESTAMP(6) NULL AFTER quote_id,
    ADD COLUMN trade_checks INT UNSIGNED NOT NULL DEFAULT 0 AFTER trade_sent_at,
    ADD COLUMN last_trade_error VARCHAR(2000) NULL AFTER trade_checks;
ALTER TABLE p2p_matches DROP CONSTRAINT ck_p2p_matches_status;
ALTER TABLE p2p_matches
    ADD CONSTRAINT ck_p2p_matches_status
        CHECK (status IN ('RESERVED', 'TRADING', 'CONFIRMED', 'RELEASED')),
    ADD CONSTRAINT ck_p2p_matches_trading
        CHECK (status <> 'TRADING'
               OR (quote_id IS NOT NULL AND trade_sent_at IS NOT NULL AND rate IS NOT NULL));
ALTER TABLE p2p_deposit_orders DROP CONSTRAINT ck_p2p_deposit_orders_status;
ALTER TABLE p2p_deposit_orders
    ADD CONSTRAINT ck_p2p_deposit_orders_status
        CHECK (status IN ('PENDING', 'MATCHING', 'IN_DOUBT', 'MATCHED', 'CANCELLED', 'EXPIRED'));
-- Reconciliation with the quote service: paybus's fills by their key (the trades it lists),
-- and the fills settled in a window (the ones whose trade must exist there).
CREATE INDEX index_p2p_matches_by_trade_key ON p2p_matches (trade_key, status);
CREATE INDEX index_p2p_matches_confirmed ON p2p_matches (status, confirmed_at);
