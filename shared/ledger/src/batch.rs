//! Posting many entries in two statements, for a transaction that makes many transitions at
//! once (confirm-withdrawal's batches, issue 14).

use std::collections::BTreeMap;

use paybus_money::Amount;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

use super::{IdemKey, LedgerError, Posting};

/// Posts every entry, or fails as a whole: a key already recorded, a balance out of range, any
/// database error. The batch is an optimisation, never a semantic: on an error the caller rolls
/// back and posts the entries one at a time with [`post`](super::post), which tells those cases
/// apart ([`Posted::AlreadyRecorded`](super::Posted::AlreadyRecorded), [`LedgerError::OutOfRange`]).
///
/// The same guarantees as [`post`](super::post), in two statements whatever the number of
/// entries:
/// 1. one upsert moves every `(partner, currency)` gate by the sum of its entries, taking the
///    gates' row locks in `(partner_id, currency)` order — the order every multi-gate
///    transaction takes, so two batches cannot deadlock on gates;
/// 2. one `INSERT … SELECT` writes the entries in that order, each entry's `balance_after`
///    read from its locked gate minus the entries of the same gate that follow it, so the chain
///    is the one sequential postings would have written.
pub async fn post_all(conn: &mut MySqlConnection, postings: &[Posting]) -> Result<(), LedgerError> {
    if postings.is_empty() {
        return Ok(());
    }
    for posting in postings {
        posting.validate()?;
    }
    let mut ordered: Vec<&Posting> = postings.iter().collect();
    // Stable: entries of one gate keep the caller's order.
    ordered.sort_by(|a, b| (a.partner_id, &a.currency).cmp(&(b.partner_id, &b.currency)));

    let mut gates: BTreeMap<(u64, &str), Amount> = BTreeMap::new();
    for posting in &ordered {
        let delta = gates
            .entry((posting.partner_id, posting.currency.as_str()))
            .or_insert(Amount::ZERO);
        *delta = delta
            .checked_add(posting.entry_type.signed(posting.amount))
            .ok_or_else(|| out_of_range(posting))?;
    }

    // Each entry's balance_after is the gate's new balance minus what the gate's later entries
    // of this batch add: walk backwards summing them.
    let mut later = vec![Amount::ZERO; ordered.len()];
    let mut after: BTreeMap<(u64, &str), Amount> = BTreeMap::new();
    for (i, posting) in ordered.iter().enumerate().rev() {
        let sum = after
            .entry((posting.partner_id, posting.currency.as_str()))
            .or_insert(Amount::ZERO);
        later[i] = *sum;
        *sum = sum
            .checked_add(posting.entry_type.signed(posting.amount))
            .ok_or_else(|| out_of_range(posting))?;
    }

    // The derived tables type their columns explicitly: a bare `?` in a select list has no
    // context to take a type from, and a decimal must never pass through a string or a double.
    let mut moves = QueryBuilder::<MySql>::new(
        "INSERT INTO partner_balances (partner_id, currency, balance) \
         SELECT g.partner_id, g.currency, g.delta FROM (",
    );
    for (n, ((partner_id, currency), delta)) in gates.iter().enumerate() {
        if n > 0 {
            moves.push(" UNION ALL ");
        }
        moves
            .push("SELECT CAST(")
            .push_bind(*partner_id)
            .push(" AS UNSIGNED) AS partner_id, ")
            .push_bind(*currency)
            .push(" AS currency, CAST(")
            .push_bind(*delta)
            .push(" AS DECIMAL(65,18)) AS delta");
    }
    // A derived table, not a bare UNION: MySQL 8 lets ON DUPLICATE KEY UPDATE name the
    // SELECT's columns only then.
    moves.push(") AS g ON DUPLICATE KEY UPDATE balance = partner_balances.balance + g.delta");
    if let Err(error) = moves.build().execute(&mut *conn).await {
        return Err(match ordered.first() {
            Some(first) if paybus_platform::db::error_number(&error) == Some(1264) => {
                out_of_range(first)
            }
            _ => error.into(),
        });
    }

    let mut entries = QueryBuilder::<MySql>::new(
        "INSERT INTO ledger_entries \
         (partner_id, currency, entry_type, amount, balance_after, reference_type, reference_id, \
          idem_key, memo) \
         SELECT e.partner_id, e.currency, e.entry_type, e.amount, b.balance - e.later, \
                e.reference_type, e.reference_id, e.idem_key, e.memo \
         FROM (",
    );
    for (seq, (posting, later)) in ordered.iter().zip(&later).enumerate() {
        if seq > 0 {
            entries.push(" UNION ALL ");
        }
        entries
            .push("SELECT CAST(")
            .push_bind(seq as u64)
            .push(" AS UNSIGNED) AS seq, CAST(")
            .push_bind(posting.partner_id)
            .push(" AS UNSIGNED) AS partner_id, ")
            .push_bind(&posting.currency)
            .push(" AS currency, ")
            .push_bind(posting.entry_type.as_str())
            .push(" AS entry_type, CAST(")
            .push_bind(posting.amount)
            .push(" AS DECIMAL(65,18)) AS amount, CAST(")
            .push_bind(*later)
            .push(" AS DECIMAL(65,18)) AS later, ")
            .push_bind(posting.reference_type.as_str())
            .push(" AS reference_type, CAST(")
            .push_bind(posting.reference_id)
            .push(" AS UNSIGNED) AS reference_id, ")
            .push_bind(posting.idem_key.as_ref().map(IdemKey::as_str))
            .push(" AS idem_key, ")
            .push_bind(posting.memo.as_deref())
            .push(" AS memo");
    }
    // ORDER BY seq: rows are inserted, and numbered, in chain order.
    entries.push(
        ") AS e JOIN partner_balances b ON b.partner_id = e.partner_id AND b.currency = e.currency \
         ORDER BY e.seq",
    );
    let inserted = entries.build().execute(&mut *conn).await?.rows_affected();
    if inserted != ordered.len() as u64 {
        // Only a gate row missing under our own lock could get here.
        return Err(LedgerError::Incomplete {
            written: inserted,
            expected: ordered.len() as u64,
        });
    }
    tracing::debug!(
        entries = ordered.len(),
        gates = gates.len(),
        "ledger entries recorded"
    );
    Ok(())
}

fn out_of_range(posting: &Posting) -> LedgerError {
    LedgerError::OutOfRange {
        partner_id: posting.partner_id,
        currency: posting.currency.clone(),
        entry_type: posting.entry_type,
        amount: posting.amount,
    }
}
