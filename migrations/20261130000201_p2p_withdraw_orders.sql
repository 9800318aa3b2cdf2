-- P2P withdraw orders: sellers' liquidity that buyers' deposit orders are matched against
-- (SPEC W1, seed 000).
--
-- Three amounts keep the liquidity honest (each checked by the schema):
--   amount            what the seller offered; never changes.
--   remaining_amount  not yet used by a CONFIRMED match: amount - SUM(CONFIRMED matches).
--   reserved_amount   held by RESERVED matches (an attempt between reserve and settle):
--                     SUM(RESERVED matches). Available to the next buyer: remaining - reserved.
--
-- status:
--   OPEN    inserted by the admin API (standing in for the partner's sell flow) with
--           remaining_amount = amount and reserved_amount = 0. While OPEN, matching moves only
--           the amounts: reserve (reserved += x, a short transaction that locked the row with
--           FOR UPDATE SKIP LOCKED, so concurrent matchers never queue behind each other),
--           settle (remaining -= x, reserved -= x, after the quote service traded), release
--           (reserved -= x: the trade failed, the attempt died and the reaper released it, or
--           the buyer's order expired).
--   FILLED  terminal. OPEN -> FILLED by settlement when remaining_amount reaches 0
--           (filled_at).
CREATE TABLE p2p_withdraw_orders (
    id                BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id        BIGINT UNSIGNED NOT NULL,
    currency          VARCHAR(16)     NOT NULL,
    amount            DECIMAL(36,18)  NOT NULL,
    remaining_amount  DECIMAL(36,18)  NOT NULL,
    reserved_amount   DECIMAL(36,18)  NOT NULL DEFAULT 0,
    status            VARCHAR(16)     NOT NULL DEFAULT 'OPEN',
    filled_at         TIMESTAMP(6)    NULL,
    created_at        TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at        TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- Matching's candidate scan: OPEN liquidity of a currency, oldest first, at most 10.
    KEY index_p2p_withdraw_orders_candidates (status, currency, created_at, id),
    KEY index_p2p_withdraw_orders_by_partner (partner_id, created_at),
    CONSTRAINT fk_p2p_withdraw_orders_partner FOREIGN KEY (partner_id) REFERENCES partners (id),
    CONSTRAINT ck_p2p_withdraw_orders_status CHECK (status IN ('OPEN', 'FILLED')),
    CONSTRAINT ck_p2p_withdraw_orders_amount CHECK (amount > 0),
    -- Never used beyond what was offered.
    CONSTRAINT ck_p2p_withdraw_orders_remaining
        CHECK (remaining_amount >= 0 AND remaining_amount <= amount),
    -- Never reserved beyond what is left.
    CONSTRAINT ck_p2p_withdraw_orders_reserved
        CHECK (reserved_amount >= 0 AND reserved_amount <= remaining_amount),
    CONSTRAINT ck_p2p_withdraw_orders_filled
        CHECK ((status = 'OPEN' AND remaining_amount > 0 AND filled_at IS NULL)
            OR (status = 'FILLED' AND remaining_amount = 0 AND filled_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
