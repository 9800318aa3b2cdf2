-- Ledger entries: every movement of a partner's balance, append-only (seed 001, DDL v2.22).
--
-- No state machine: rows are inserted only by `shared::ledger::post`, under the partner's
-- balance gate lock, and are never updated or deleted; a correction is a new entry (e.g. a
-- MIGRATION CREDIT). entry_type CREDIT adds `amount`, DEBIT and FEE subtract it; amount is
-- always positive and balance_after is the balance right after this entry.
--
-- idem_key (seed 001 §3): set only where one reference must produce exactly one row —
-- WDR_CONFIRM:{withdrawal id} (DEBIT), DEP_CREDIT:{deposit id} (CREDIT), DEP_FEE:{deposit id}
-- (FEE). NULL everywhere else (P2P legs, safety-net corrections, MIGRATION, settlement inflow
-- legitimately repeat per reference); a UNIQUE key admits any number of NULLs. A duplicate key
-- is the last line of defence behind the conditional status transition, reported as "already
-- recorded", not as an error.
CREATE TABLE ledger_entries (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    partner_id      BIGINT UNSIGNED NOT NULL,
    currency        VARCHAR(16)     NOT NULL,
    entry_type      VARCHAR(8)      NOT NULL,
    amount          DECIMAL(36,18)  NOT NULL,
    balance_after   DECIMAL(36,18)  NOT NULL,
    reference_type  VARCHAR(32)     NOT NULL,
    reference_id    BIGINT UNSIGNED NOT NULL,
    idem_key        VARCHAR(80)     NULL,
    memo            VARCHAR(255)    NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_ledger_idem_key (idem_key),
    -- The balance_after chain of one (partner, currency), in posting order.
    KEY index_ledger_entries_chain (partner_id, currency, id),
    KEY index_ledger_entries_by_reference (reference_type, reference_id),
    -- An entry belongs to a gate row: no entry without a balance to keep in step with.
    CONSTRAINT fk_ledger_entries_balance FOREIGN KEY (partner_id, currency)
        REFERENCES partner_balances (partner_id, currency),
    CONSTRAINT ck_ledger_entries_entry_type CHECK (entry_type IN ('DEBIT', 'CREDIT', 'FEE')),
    CONSTRAINT ck_ledger_entries_amount CHECK (amount > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
