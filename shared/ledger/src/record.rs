//! The one ledger writer: every entry of every workflow is posted here, one or many at a time,
//! under its `(partner, currency)` gate row (seed 001 §4-3).

use std::collections::{BTreeMap, HashSet};

use paybus_db::{error_number, is_duplicate_on};
use paybus_money::Amount;
use sqlx::{MySql, MySqlConnection, QueryBuilder};

use super::{
    idem_key::IdemKey,
    posting::{LedgerError, Posted, Posting},
};

/// The unique key behind [`IdemKey`]. MariaDB names it `'uk_ledger_idem_key'` in the duplicate
/// message, MySQL 8 `'ledger_entries.uk_ledger_idem_key'`.
const IDEM_KEY_INDEX: &str = "uk_ledger_idem_key";

/// MySQL's "out of range value for column" (strict mode refuses, nothing is rounded).
const OUT_OF_RANGE: u16 = 1264;

/// Posts every entry inside the caller's transaction and moves the partners' balances with
/// them: one [`Posted`] per posting, in the caller's order.
///
/// Two statements whatever the number of entries:
/// 1. one upsert creates each `(partner, currency)` gate row of `partner_balances` on its first
///    posting, takes its exclusive lock and moves it by the sum of its entries;
/// 2. one `INSERT … SELECT` writes the entries gate by gate, each entry's `balance_after` read
///    from its locked gate minus the entries of the same gate that follow it, so the chain is
///    the one sequential postings would have written.
///
/// Postings of one gate therefore run one at a time and the chain stays gap-free. The gates
/// are locked in `(partner_id, currency)` order, entries of one gate in the caller's order:
/// every transaction that posts takes them in that one order, so two of them never wait for
/// each other's gates in a cycle.
///
/// A duplicate [`IdemKey`] is the expected outcome of a repeated confirmation:
/// [`Posted::AlreadyRecorded`], logged at WARN, and the transaction stays usable (MySQL rolls
/// back only the failed statement, and the gates are moved back). A key repeated within the
/// call is recorded once, as sequential postings would. The server does not say which key of
/// several collided, so on that rare path the entries are posted again one at a time. Any
/// other database error, including a duplicate on some other unique key, is
/// [`LedgerError::Database`]; a balance that would leave `DECIMAL(36,18)` is
/// [`LedgerError::OutOfRange`] (for several postings, naming the first of the batch).
///
/// The balance may go negative: the ledger records what happened on chain, it does not refuse
/// it. A caller that needs a floor checks it itself.
#[tracing::instrument(name = "ledger.post_all", skip_all, fields(postings = postings.len()))]
pub async fn post_all(
    conn: &mut MySqlConnection,
    postings: &[Posting],
) -> Result<Vec<Posted>, LedgerError> {
    for posting in postings {
        posting.validate()?;
    }
    let mut posted: Vec<Option<Posted>> = vec![None; postings.len()];
    let mut keys = HashSet::new();
    let mut pending = Vec::with_capacity(postings.len());
    for (i, posting) in postings.iter().enumerate() {
        match &posting.idem_key {
            Some(key) if !keys.insert(key) => posted[i] = Some(already_recorded(posting, key)),
            _ => pending.push(i),
        }
    }
    // Stable: entries of one gate keep the caller's order.
    pending.sort_by(|&a, &b| gate(&postings[a]).cmp(&gate(&postings[b])));

    let mut one_at_a_time: &[usize] = &pending;
    if pending.len() > 1 {
        let set: Vec<&Posting> = pending.iter().map(|&i| &postings[i]).collect();
        match record(conn, &set).await? {
            Recording::Recorded => {
                for &i in &pending {
                    posted[i] = Some(Posted::Recorded);
                }
                one_at_a_time = &[];
            }
            Recording::Duplicate(_) => tracing::debug!(
                entries = set.len(),
                "a key of the batch is already recorded; posting its entries one at a time"
            ),
        }
    }
    for &i in one_at_a_time {
        let posting = &postings[i];
        posted[i] = Some(match record(conn, &[posting]).await? {
            Recording::Recorded => Posted::Recorded,
            Recording::Duplicate(error) => match &posting.idem_key {
                Some(key) => already_recorded(posting, key),
                // A NULL key cannot collide; if the server says otherwise, do not hide it.
                None => return Err(error.into()),
            },
        });
    }
    // Every slot is filled above: a repeated key at once, the rest by the set or one at a time.
    let posted: Vec<Posted> = posted.into_iter().flatten().collect();
    if posted.len() != postings.len() {
        return Err(LedgerError::Incomplete {
            written: posted.len() as u64,
            expected: postings.len() as u64,
        });
    }
    Ok(posted)
}

fn gate(posting: &Posting) -> (u64, &str) {
    (posting.partner_id, posting.currency.as_str())
}

fn already_recorded(posting: &Posting, key: &IdemKey) -> Posted {
    tracing::warn!(
        idem_key = key.as_str(),
        reference_type = %posting.reference_type,
        reference_id = posting.reference_id,
        "ledger entry already recorded"
    );
    Posted::AlreadyRecorded {
        idem_key: key.clone(),
    }
}

enum Recording {
    /// Every entry of the set is written.
    Recorded,
    /// Some entry's key is already in the ledger: nothing is written and the gates are back
    /// where they were.
    Duplicate(sqlx::Error),
}

/// Moves the gates and writes the entries of `set` (sorted by gate), all or nothing.
async fn record(conn: &mut MySqlConnection, set: &[&Posting]) -> Result<Recording, LedgerError> {
    let mut gates: BTreeMap<(u64, &str), Amount> = BTreeMap::new();
    for posting in set {
        let delta = gates.entry(gate(posting)).or_insert(Amount::ZERO);
        *delta = delta
            .checked_add(posting.entry_type.signed(posting.amount))
            .ok_or_else(|| out_of_range(posting))?;
    }
    if let Err(error) = move_gates(conn, &gates).await {
        return Err(match set.first() {
            Some(first) if error_number(&error) == Some(OUT_OF_RANGE) => out_of_range(first),
            _ => error.into(),
        });
    }

    // Each entry's balance_after is the gate's new balance minus what the gate's later entries
    // of this set add: walk backwards summing them.
    let mut later = vec![Amount::ZERO; set.len()];
    let mut after: BTreeMap<(u64, &str), Amount> = BTreeMap::new();
    for (i, posting) in set.iter().enumerate().rev() {
        let sum = after.entry(gate(posting)).or_insert(Amount::ZERO);
        later[i] = *sum;
        *sum = sum
            .checked_add(posting.entry_type.signed(posting.amount))
            .ok_or_else(|| out_of_range(posting))?;
    }
    match insert_entries(conn, set, &later).await {
        Ok(done) if done.rows_affected() != set.len() as u64 => {
            // Only a gate row missing under our own lock could get here.
            return Err(LedgerError::Incomplete {
                written: done.rows_affected(),
                expected: set.len() as u64,
            });
        }
        Ok(_) => {}
        Err(error) if is_duplicate_on(&error, IDEM_KEY_INDEX) => {
            // The balances moved for entries that are not written: move them back (the only
            // extra statement, on this rare path).
            let back: BTreeMap<(u64, &str), Amount> = gates
                .into_iter()
                .map(|(gate, delta)| (gate, delta.negated()))
                .collect();
            move_gates(conn, &back).await?;
            return Ok(Recording::Duplicate(error));
        }
        Err(error) => return Err(error.into()),
    }
    tracing::debug!(
        entries = set.len(),
        gates = gates.len(),
        "ledger entries recorded"
    );
    Ok(Recording::Recorded)
}

/// One upsert for every gate, in `(partner_id, currency)` order (the map's).
async fn move_gates(
    conn: &mut MySqlConnection,
    gates: &BTreeMap<(u64, &str), Amount>,
) -> Result<(), sqlx::Error> {
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
    // ORDER BY: the gates' locks are taken in the global order (see `post_all`), not in
    // whatever order the derived table happens to yield. A derived table, not a bare UNION:
    // MySQL 8 lets ON DUPLICATE KEY UPDATE name the SELECT's columns only then.
    moves.push(
        ") AS g ORDER BY g.partner_id, g.currency \
         ON DUPLICATE KEY UPDATE balance = partner_balances.balance + g.delta",
    );
    moves.build().execute(&mut *conn).await?;
    Ok(())
}

async fn insert_entries(
    conn: &mut MySqlConnection,
    set: &[&Posting],
    later: &[Amount],
) -> Result<sqlx::mysql::MySqlQueryResult, sqlx::Error> {
    let mut entries = QueryBuilder::<MySql>::new(
        "INSERT INTO ledger_entries \
         (partner_id, currency, entry_type, amount, balance_after, reference_type, reference_id, \
          idem_key, memo) \
         SELECT e.partner_id, e.currency, e.entry_type, e.amount, b.balance - e.later, \
                e.reference_type, e.reference_id, e.idem_key, e.memo \
         FROM (",
    );
    for (seq, (posting, later)) in set.iter().zip(later).enumerate() {
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
    // STRAIGHT_JOIN and FORCE INDEX: the entries drive and each gate is found by its primary
    // key. Left to itself the optimizer may scan the small gate table first, or scan it into
    // a join buffer after the entries (it did, with a new table's statistics: a deadlock in
    // `concurrent_batches_over_different_gates_never_deadlock`), and INSERT … SELECT
    // share-locks every row it reads, other transactions' gates included: two batches that
    // hold some gates each then wait for each other's (a deadlock, measured with four
    // shards). ORDER BY seq: rows are inserted, and numbered, in chain order.
    entries.push(
        ") AS e STRAIGHT_JOIN partner_balances b FORCE INDEX (PRIMARY) \
         ON b.partner_id = e.partner_id AND b.currency = e.currency \
         ORDER BY e.seq",
    );
    entries.build().execute(&mut *conn).await
}

fn out_of_range(posting: &Posting) -> LedgerError {
    LedgerError::OutOfRange {
        partner_id: posting.partner_id,
        currency: posting.currency.clone(),
        entry_type: posting.entry_type,
        amount: posting.amount,
    }
}

/// Posts one entry: [`post_all`] with one posting (the same two statements, the same
/// guarantees), for the callers that have one.
#[tracing::instrument(
    skip_all,
    fields(
        partner_id = posting.partner_id,
        currency = %posting.currency,
        entry_type = %posting.entry_type,
        reference_type = %posting.reference_type,
        reference_id = posting.reference_id,
        idem_key = posting.idem_key.as_ref().map(IdemKey::as_str),
    )
)]
pub async fn post(conn: &mut MySqlConnection, posting: &Posting) -> Result<Posted, LedgerError> {
    let mut posted = post_all(conn, std::slice::from_ref(posting)).await?;
    posted.pop().ok_or(LedgerError::Incomplete {
        written: 0,
        expected: 1,
    })
}

/// A partner's balance in `currency` now (in the caller's transaction); `None` before its first
/// posting.
pub async fn balance(
    conn: &mut MySqlConnection,
    partner_id: u64,
    currency: &str,
) -> Result<Option<Amount>, sqlx::Error> {
    sqlx::query_scalar("SELECT balance FROM partner_balances WHERE partner_id = ? AND currency = ?")
        .bind(partner_id)
        .bind(currency)
        .fetch_optional(conn)
        .await
}

/// Whether the keyed entry `key` is in the ledger (a dead letter's triage: its posting is
/// already applied).
pub async fn key_exists(conn: &mut MySqlConnection, key: &IdemKey) -> Result<bool, sqlx::Error> {
    let found: Option<u64> = sqlx::query_scalar("SELECT id FROM ledger_entries WHERE idem_key = ?")
        .bind(key.as_str())
        .fetch_optional(conn)
        .await?;
    Ok(found.is_some())
}
