-- P2P matches: one deposit order's share of one withdraw order (SPEC W1, seed 000). An attempt
-- reserves, trades with the quote service with no lock held, then settles or releases.
--
-- status:
--   RESERVED   inserted by an attempt's reserve transaction, together with the withdraw order's
--              reserved_amount += amount (the candidates locked FOR UPDATE SKIP LOCKED, oldest
--              first, at most 10). trade_key is the fill's idempotency key at the quote
--              service (`p2p-deposit-{deposit order}-fill-{n}`): a retried fill asks for the
--              same trade and gets the one already made, never a second.
--   CONFIRMED  terminal. RESERVED -> CONFIRMED by settlement once the quote service traded
--              (external_trade_id, rate; the fill's fee on its first match), with the ledger legs
--              (buyer's partner CREDIT and FEE, seller's partner DEBIT, reference P2P_SETTLEMENT,
--              idem_key NULL) and the withdraw order's remaining/reserved amounts, in one
--              transaction.
--   RELEASED   terminal. RESERVED -> RELEASED (released_at, release_reason) when the trade
--              failed (QUOTE_FAILED), the attempt died and the zombie reaper took the order back
--              (REAPED), or the order expired (EXPIRED); the withdraw order's reserved_amount
--              is given back in the same transaction.
CREATE TABLE p2p_matches (
    id                 BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    deposit_order_id   BIGINT UNSIGNED NOT NULL,
    withdraw_order_id  BIGINT UNSIGNED NOT NULL,
    amount             DECIMAL(36,18)  NOT NULL,
    fee                DECIMAL(36,18)  NOT NULL DEFAULT 0,
    rate               DECIMAL(36,18)  NULL,
    trade_key          VARCHAR(100)    NOT NULL,
    external_trade_id  VARCHAR(128)    NULL,
    status             VARCHAR(16)     NOT NULL DEFAULT 'RESERVED',
    release_reason     VARCHAR(32)     NULL,
    reserved_at        TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    confirmed_at       TIMESTAMP(6)    NULL,
    released_at        TIMESTAMP(6)    NULL,
    updated_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    KEY index_p2p_matches_by_deposit_order (deposit_order_id, status),
    KEY index_p2p_matches_by_withdraw_order (withdraw_order_id, status),
    -- The audit's "RESERVED for longer than the zombie timeout".
    KEY index_p2p_matches_reserved_age (status, reserved_at),
    CONSTRAINT fk_p2p_matches_deposit_order
        FOREIGN KEY (deposit_order_id) REFERENCES p2p_deposit_orders (id),
    CONSTRAINT fk_p2p_matches_withdraw_order
        FOREIGN KEY (withdraw_order_id) REFERENCES p2p_withdraw_orders (id),
    CONSTRAINT ck_p2p_matches_status CHECK (status IN ('RESERVED', 'CONFIRMED', 'RELEASED')),
    CONSTRAINT ck_p2p_matches_amount CHECK (amount > 0),
    CONSTRAINT ck_p2p_matches_fee CHECK (fee >= 0),
    CONSTRAINT ck_p2p_matches_confirmed
        CHECK (status <> 'CONFIRMED'
               OR (external_trade_id IS NOT NULL AND rate IS NOT NULL AND confirmed_at IS NOT NULL)),
    CONSTRAINT ck_p2p_matches_released
        CHECK (status <> 'RELEASED' OR (released_at IS NOT NULL AND release_reason IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
