//! The partner ledger (W2, seed 001): every movement of a partner's balance is one append-only row of
//! `ledger_entries`, posted under the partner's balance gate row, so the `balance_after` chain
//! never forks and `partner_balances` always equals the sum of the entries.
//!
//! Two layers keep a confirmation from moving money twice (seed 001 §2):
//! 1. the caller's conditional status transition (affected rows decide), and
//! 2. the last line of defence here: [`IdemKey`] on the three paths where one reference must
//!    produce exactly one entry; a repeat returns [`Posted::AlreadyRecorded`], not an error.
//!
//! [`post_all`] is the one writer of entries: any number of them in two statements, inside the
//! caller's transaction (the caller commits); [`post`] is it with one posting.
//! [`audit::CHECKS`] are the ledger's invariants in plain SQL (run by `paybus audit` with
//! every workflow's own).
//!
//! Amounts are [`paybus_money::Amount`]: exact over the whole `DECIMAL(36,18)` range. A posting
//! that would take a balance beyond that range is refused ([`LedgerError::OutOfRange`]),
//! never rounded.

pub mod audit;
mod idem_key;
mod posting;
mod record;

pub use idem_key::IdemKey;
pub use posting::{
    EntryType, LedgerError, Posted, Posting, ReferenceType, balance, key_exists, post,
};
pub use record::post_all;
