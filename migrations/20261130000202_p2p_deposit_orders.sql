-- P2P deposit orders: a buyer's order, filled from sellers' withdraw orders (SPEC W1, seed 000).
--
-- status (every transition is a conditional UPDATE whose affected rows decide it; the terminal
-- ones, with closed_at and close_reason, are written only by `paybus_p2p::deposit_order::close`):
--   PENDING    inserted by the create API when async matching is on (with the
--              `p2p.deposit_order.created` outbox message), or handed back by outcome
--              accounting after an attempt that did not fill it (match_attempt_count + 1,
--              claimed_at NULL, next_attempt_at = now + backoff), or by the zombie reaper (a
--              MATCHING claim older than the timeout: its process died; its RESERVED matches are
--              released in the same transaction, next_attempt_at = now, no attempt counted).
--   MATCHING   PENDING -> MATCHING by a claim: match-deposit's conditional UPDATE on a message,
--              its due-orders job (a batch, FOR UPDATE SKIP LOCKED), or the create API itself
--              when async matching is off (inline, in the transaction that inserts the row). A
--              claim always stamps claimed_at: the reaper only ever takes claimed rows, and
--              every later write of the attempt is conditional on that stamp.
--   MATCHED    terminal. MATCHING -> MATCHED by settlement when remaining_amount reaches 0
--              (close_reason FILLED), with its CONFIRMED matches, ledger legs and the partner's
--              P2P_DEPOSIT_MATCHED notification, in one transaction.
--   CANCELLED  terminal. MATCHING -> CANCELLED by the attempt when fill-or-cancel finds too
--              little liquidity (NO_LIQUIDITY), or by outcome accounting at max attempts
--              (MATCH_FAILED, with a dead letter).
--   EXPIRED    terminal. PENDING/MATCHING -> EXPIRED past expires_at (close_reason EXPIRED), by
--              the expiry job (MATCHING only once its claim is older than the zombie timeout) or
--              by the attempt / accounting that finds it expired; RESERVED matches released.
CREATE TABLE p2p_deposit_orders (
    id                   BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id           BIGINT UNSIGNED NOT NULL,
    -- The partner's own id for the order: a repeated create with the same one returns the
    -- order already created instead of a second one.
    partner_order_ref    VARCHAR(64)     NULL,
    currency             VARCHAR(16)     NOT NULL,
    amount               DECIMAL(36,18)  NOT NULL,
    -- Not yet filled by CONFIRMED matches: amount - SUM(CONFIRMED matches).
    remaining_amount     DECIMAL(36,18)  NOT NULL,
    -- The quote service's fees of the fills so far.
    fee_amount           DECIMAL(36,18)  NOT NULL DEFAULT 0,
    status               VARCHAR(16)     NOT NULL DEFAULT 'PENDING',
    claimed_at           TIMESTAMP(6)    NULL,
    -- Attempts that ended without a terminal state (errors included), seed 000 §3.3.
    match_attempt_count  INT UNSIGNED    NOT NULL DEFAULT 0,
    -- When a PENDING order is due; NULL: due now.
    next_attempt_at      TIMESTAMP(6)    NULL,
    last_error           VARCHAR(2000)   NULL,
    expires_at           TIMESTAMP(6)    NOT NULL,
    closed_at            TIMESTAMP(6)    NULL,
    close_reason         VARCHAR(32)     NULL,
    created_at           TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at           TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_p2p_deposit_orders_partner_ref (partner_id, partner_order_ref),
    -- The due-orders job's batch claim (PENDING, oldest due first).
    KEY index_p2p_deposit_orders_due (status, next_attempt_at),
    -- The zombie reaper (MATCHING claimed longer ago than the timeout).
    KEY index_p2p_deposit_orders_claims (status, claimed_at),
    -- The expiry job.
    KEY index_p2p_deposit_orders_expiry (status, expires_at),
    CONSTRAINT fk_p2p_deposit_orders_partner FOREIGN KEY (partner_id) REFERENCES partners (id),
    CONSTRAINT ck_p2p_deposit_orders_status
        CHECK (status IN ('PENDING', 'MATCHING', 'MATCHED', 'CANCELLED', 'EXPIRED')),
    CONSTRAINT ck_p2p_deposit_orders_amount CHECK (amount > 0),
    CONSTRAINT ck_p2p_deposit_orders_remaining
        CHECK (remaining_amount >= 0 AND remaining_amount <= amount),
    CONSTRAINT ck_p2p_deposit_orders_fee CHECK (fee_amount >= 0),
    -- A claim always says when it was taken (the reaper's condition).
    CONSTRAINT ck_p2p_deposit_orders_claimed CHECK (status <> 'MATCHING' OR claimed_at IS NOT NULL),
    -- Terminal exactly when closed, and closed always says why.
    CONSTRAINT ck_p2p_deposit_orders_closed
        CHECK ((status IN ('MATCHED', 'CANCELLED', 'EXPIRED'))
               = (closed_at IS NOT NULL AND close_reason IS NOT NULL)),
    CONSTRAINT ck_p2p_deposit_orders_matched CHECK (status <> 'MATCHED' OR remaining_amount = 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
