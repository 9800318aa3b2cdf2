-- Partner balances: one row per (partner, currency), the ledger's gate lock (seed 001 §4-3).
--
-- No state machine. Only `shared::ledger::post` writes here: it creates the row on the first
-- posting (INSERT ... ON DUPLICATE KEY UPDATE), locks it with SELECT ... FOR UPDATE before it
-- inserts a ledger entry, and sets `balance` to that entry's balance_after. Every posting for a
-- (partner, currency) therefore runs one at a time, which keeps the balance_after chain
-- gap-free; an idempotency hit also happens under this lock.
--
-- Invariant (checked by `paybus audit`): balance = SUM(CREDIT) - SUM(DEBIT) - SUM(FEE) over
-- the partner's ledger entries in that currency. The balance may go negative: the ledger
-- records what happened on chain, it does not refuse it.
CREATE TABLE partner_balances (
    partner_id      BIGINT UNSIGNED NOT NULL,
    currency        VARCHAR(16)     NOT NULL,
    balance         DECIMAL(36,18)  NOT NULL DEFAULT 0,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (partner_id, currency),
    CONSTRAINT fk_partner_balances_partner FOREIGN KEY (partner_id) REFERENCES partners (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
