-- Withdrawals: a partner's order to send funds on chain (SPEC W2, seed 001).
--
-- kind:
--   NORMAL               a partner's own withdrawal: its confirmation DEBITs the partner's
--                        balance exactly once (ledger idem_key WDR_CONFIRM:{id}).
--   SETTLEMENT_WITHDRAW  settlement payout; the balance moved when it was settled, so its
--                        confirmation writes no ledger entry.
--   SELF_TRANSFER        a transfer between our own wallets; no ledger entry either.
--
-- status (every transition is a conditional UPDATE whose affected rows decide it, SPEC §2.1,
-- and writes a withdrawal_status_history row in the same transaction):
--   REQUESTED     inserted by the withdrawal API when the partner asks.
--   PROCESSING    REQUESTED -> PROCESSING by the signer when it takes the row to build a tx.
--   BROADCASTING  PROCESSING -> BROADCASTING by the signer once the tx is sent (tx_hash known).
--   STALE         PROCESSING/BROADCASTING -> STALE by the sweeper when no confirmation came in
--                 time, so ops see it; a late confirmation still confirms it.
--   CONFIRMED     terminal. BROADCASTING/PROCESSING/STALE -> CONFIRMED only by
--                 confirm-withdrawal (`WHERE id = ? AND status IN ('BROADCASTING',
--                 'PROCESSING', 'STALE')`); the same transaction writes the DEBIT (NORMAL
--                 only), the history row and the WITHDRAWAL_CONFIRMED notification. 0 rows
--                 affected = someone else confirmed it: no side effect at all.
--   FAILED        terminal. REQUESTED/PROCESSING/BROADCASTING/STALE -> FAILED by the signer
--                 (rejected tx) or by ops; never debited.
CREATE TABLE withdrawals (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id      BIGINT UNSIGNED NOT NULL,
    kind            VARCHAR(32)     NOT NULL DEFAULT 'NORMAL',
    status          VARCHAR(16)     NOT NULL DEFAULT 'REQUESTED',
    currency        VARCHAR(16)     NOT NULL,
    amount          DECIMAL(36,18)  NOT NULL,
    to_address      VARCHAR(255)    NOT NULL,
    tx_hash         VARCHAR(128)    NULL,
    confirmed_at    TIMESTAMP(6)    NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    KEY index_withdrawals_by_partner (partner_id, created_at),
    -- The sweeper's "in flight for too long" scan (PROCESSING/BROADCASTING -> STALE).
    KEY index_withdrawals_by_status_age (status, updated_at),
    KEY index_withdrawals_by_tx_hash (tx_hash),
    CONSTRAINT fk_withdrawals_partner FOREIGN KEY (partner_id) REFERENCES partners (id),
    CONSTRAINT ck_withdrawals_kind
        CHECK (kind IN ('NORMAL', 'SETTLEMENT_WITHDRAW', 'SELF_TRANSFER')),
    CONSTRAINT ck_withdrawals_status
        CHECK (status IN ('REQUESTED', 'PROCESSING', 'BROADCASTING', 'STALE', 'CONFIRMED', 'FAILED')),
    CONSTRAINT ck_withdrawals_amount CHECK (amount > 0),
    -- A confirmation always records which tx and when (seed 001 §4-2 sets both).
    CONSTRAINT ck_withdrawals_confirmed
        CHECK (status <> 'CONFIRMED' OR (tx_hash IS NOT NULL AND confirmed_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
