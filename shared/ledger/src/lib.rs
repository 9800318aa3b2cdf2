//! The partner ledger (W2, seed 001): every movement of a partner's balance is one append-only
//! row of `ledger_entries`, posted under the partner's balance gate row, so the `balance_after`
//! chain never forks and `partner_balances` always equals the sum of the entries.
//!
//! - [`post_all`] is the one writer of entries (any number in two statements, inside the
//!   caller's transaction; the caller commits); [`post`] is it with one posting.
//! - [`IdemKey`] is the last line of defence against moving money twice (seed 001 §2), behind
//!   the caller's conditional transition: on the three paths where one reference must produce
//!   exactly one entry, a repeat returns [`Posted::AlreadyRecorded`], not an error.
//! - [`audit::CHECKS`]: the ledger's invariants in plain SQL.
//!
//! Amounts are [`paybus_money::Amount`], exact over the whole `DECIMAL(36,18)` range; a posting
//! beyond it is refused ([`LedgerError::OutOfRange`]), never rounded.

pub mod audit;
mod entry;
mod idem_key;
mod posting;
mod record;

pub use entry::{EntryType, ReferenceType};
pub use idem_key::IdemKey;
pub use posting::{LedgerError, Posted, Posting};
pub use record::{balance, key_exists, post, post_all};
