//! The ledger (W2): balance gate rows, entries with idempotency keys, audit.
