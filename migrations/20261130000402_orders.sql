-- Orders of a market (SPEC W4). Placed through the admin API (the order gateway's stand-in),
-- filled by the matching engine (the fill route stands in for it), cancelled by cancel-orders
-- when their market is suspended.
--
-- status (every transition is a conditional UPDATE whose affected rows decide it):
--   OPEN              inserted by place-order, only while the market is ACTIVE (it reads the
--                     market row LOCK IN SHARE MODE in the same transaction).
--   PARTIALLY_FILLED  OPEN -> PARTIALLY_FILLED by a fill that leaves quantity open.
--   FILLED            terminal. OPEN/PARTIALLY_FILLED -> FILLED by the fill that completes it
--                     (filled_quantity = quantity).
--   CANCELLED         terminal. OPEN/PARTIALLY_FILLED -> CANCELLED by cancel-orders
--                     (`WHERE id = ? AND status IN ('OPEN', 'PARTIALLY_FILLED')`), with
--                     cancel_reason (MARKET_SUSPENDED) and cancelled_at. 0 rows: the order was
--                     filled or cancelled meanwhile, and its task is SKIPPED, not FAILED.
--
-- open_market_id is the market while the order is open and NULL once it is closed: its index
-- serves every "open orders of a market" question (the suspension's frozen set, materialised
-- in id order; progress's "open orders left") without reading closed history.
CREATE TABLE orders (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    market_id       BIGINT UNSIGNED NOT NULL,
    account_id      BIGINT UNSIGNED NOT NULL,
    side            VARCHAR(4)      NOT NULL,
    price           DECIMAL(36,18)  NOT NULL,
    quantity        DECIMAL(36,18)  NOT NULL,
    filled_quantity DECIMAL(36,18)  NOT NULL DEFAULT 0,
    status          VARCHAR(16)     NOT NULL DEFAULT 'OPEN',
    cancel_reason   VARCHAR(32)     NULL,
    cancelled_at    TIMESTAMP(6)    NULL,
    open_market_id  BIGINT UNSIGNED GENERATED ALWAYS AS
        (CASE WHEN status IN ('OPEN', 'PARTIALLY_FILLED') THEN market_id END) STORED,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- Open orders of a market in id order: the materialiser's chunks, progress, the audit.
    KEY index_orders_open_by_market (open_market_id, id),
    KEY index_orders_by_market (market_id, created_at),
    CONSTRAINT fk_orders_market FOREIGN KEY (market_id) REFERENCES markets (id),
    CONSTRAINT ck_orders_status
        CHECK (status IN ('OPEN', 'PARTIALLY_FILLED', 'FILLED', 'CANCELLED')),
    CONSTRAINT ck_orders_side CHECK (side IN ('BUY', 'SELL')),
    CONSTRAINT ck_orders_price CHECK (price > 0),
    CONSTRAINT ck_orders_quantity CHECK (quantity > 0),
    CONSTRAINT ck_orders_filled CHECK (filled_quantity >= 0 AND filled_quantity <= quantity),
    CONSTRAINT ck_orders_filled_status
        CHECK ((status = 'FILLED') = (filled_quantity = quantity)),
    CONSTRAINT ck_orders_cancelled
        CHECK ((status = 'CANCELLED') = (cancel_reason IS NOT NULL AND cancelled_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
