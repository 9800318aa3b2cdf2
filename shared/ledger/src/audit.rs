//! The ledger's own invariants (seed 001 §7 and docs/workflows/confirmations.md): plain SQL,
//! one statement per check (one consistent snapshot each). Workflows add checks of their own on
//! the entries their transitions owe (e.g. `paybus_confirmations::audit`).
//!
//! | check | invariant |
//! | --- | --- |
//! | `duplicate_keyed_entries` | no reference carries two keyed entries of one type (seed §7: the double DEBIT) |
//! | `misplaced_idem_key` | a key names its own entry: `WDR_CONFIRM:{id}` on the DEBIT of withdrawal `id`, `DEP_CREDIT:{id}` / `DEP_FEE:{id}` on the CREDIT / FEE of deposit `id` |
//! | `balance_mismatch` | every balance equals CREDITs − DEBITs − FEEs of its entries; no entries without a balance row |
//! | `broken_chain` | each entry's `balance_after` = the previous entry's (or 0) ± its amount, per partner and currency in id order |
//!
//! Amounts are read as text, never as a float or a rounded decimal. The `recent` forms read
//! through `index_ledger_entries_recent` and cost what the window holds: its keyed references,
//! its entries and their predecessors, and the touched balances against their last entry's
//! `balance_after` (with the chain intact, the sum of their entries).

use std::fmt;

use paybus_ops::audit::{Check, Finding, Window};
use serde::Serialize;
use sqlx::MySqlConnection;

/// The ledger's checks, in the order `paybus audit` runs them.
pub const CHECKS: &[Check] = &[
    paybus_ops::audit_check!("duplicate_keyed_entries", duplicate_keyed_entries, recent: recent_duplicate_keyed_entries),
    paybus_ops::audit_check!("misplaced_idem_key", misplaced_idem_keys, recent: recent_misplaced_idem_keys),
    paybus_ops::audit_check!("balance_mismatch", balance_mismatches, recent: recent_balance_mismatches),
    paybus_ops::audit_check!("broken_chain", broken_chains, recent: recent_broken_chains),
];

/// One broken invariant; [`fmt::Display`] renders it as one line naming the ids involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Violation {
    /// One reference carries two or more keyed entries of one type (seed 001 §7).
    DuplicateKeyedEntries {
        reference_type: String,
        reference_id: u64,
        entry_type: String,
        entry_ids: Vec<u64>,
    },
    /// A keyed entry whose key does not name its own type and reference.
    MisplacedIdemKey {
        entry_id: u64,
        idem_key: String,
        entry_type: String,
        reference_type: String,
        reference_id: u64,
    },
    /// A balance row that differs from the signed sum of its entries; `balance` is `None`
    /// when there are entries but no balance row.
    BalanceMismatch {
        partner_id: u64,
        currency: String,
        balance: Option<String>,
        entries_sum: String,
    },
    /// An entry whose `balance_after` does not follow from the entry before it.
    BrokenChain {
        entry_id: u64,
        partner_id: u64,
        currency: String,
        balance_after: String,
        expected: String,
    },
}

impl Finding for Violation {
    fn check(&self) -> &'static str {
        match self {
            Violation::DuplicateKeyedEntries { .. } => "duplicate_keyed_entries",
            Violation::MisplacedIdemKey { .. } => "misplaced_idem_key",
            Violation::BalanceMismatch { .. } => "balance_mismatch",
            Violation::BrokenChain { .. } => "broken_chain",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.check())?;
        match self {
            Violation::DuplicateKeyedEntries {
                reference_type,
                reference_id,
                entry_type,
                entry_ids,
            } => {
                let ids: Vec<String> = entry_ids.iter().map(u64::to_string).collect();
                write!(
                    f,
                    "{reference_type} {reference_id} has {} keyed {entry_type} entries (ids {})",
                    entry_ids.len(),
                    ids.join(", ")
                )
            }
            Violation::MisplacedIdemKey {
                entry_id,
                idem_key,
                entry_type,
                reference_type,
                reference_id,
            } => write!(
                f,
                "entry {entry_id} carries key {idem_key} but is a {entry_type} of \
                 {reference_type} {reference_id}"
            ),
            Violation::BalanceMismatch {
                partner_id,
                currency,
                balance,
                entries_sum,
            } => match balance {
                Some(balance) => write!(
                    f,
                    "partner {partner_id} {currency} balance is {balance} but its entries sum \
                     to {entries_sum}"
                ),
                None => write!(
                    f,
                    "partner {partner_id} {currency} has entries summing to {entries_sum} but \
                     no balance row"
                ),
            },
            Violation::BrokenChain {
                entry_id,
                partner_id,
                currency,
                balance_after,
                expected,
            } => write!(
                f,
                "entry {entry_id} (partner {partner_id} {currency}) has balance_after \
                 {balance_after}, expected {expected} from the entry before it"
            ),
        }
    }
}

/// The keys that name their own entry (what [`super::IdemKey`] builds), negated: a `WHERE`
/// tail of the full and the windowed misplaced-key checks.
macro_rules! misplaced_key {
    () => {
        " AND NOT ( \
            (entry_type = 'DEBIT' AND reference_type = 'WITHDRAWAL' \
             AND idem_key = CONCAT('WDR_CONFIRM:', reference_id)) \
         OR (entry_type = 'CREDIT' AND reference_type = 'DEPOSIT' \
             AND idem_key = CONCAT('DEP_CREDIT:', reference_id)) \
         OR (entry_type = 'FEE' AND reference_type = 'DEPOSIT' \
             AND idem_key = CONCAT('DEP_FEE:', reference_id)))"
    };
}

fn duplicate(
    (reference_type, reference_id, entry_type, ids): (String, u64, String, String),
) -> Violation {
    Violation::DuplicateKeyedEntries {
        reference_type,
        reference_id,
        entry_type,
        // GROUP_CONCAT stops at group_concat_max_len; the ids it did list are shown.
        entry_ids: ids.split(',').filter_map(|id| id.parse().ok()).collect(),
    }
}

fn misplaced(
    (entry_id, idem_key, entry_type, reference_type, reference_id): (
        u64,
        String,
        String,
        String,
        u64,
    ),
) -> Violation {
    Violation::MisplacedIdemKey {
        entry_id,
        idem_key,
        entry_type,
        reference_type,
        reference_id,
    }
}

fn mismatch(
    (partner_id, currency, balance, entries_sum): (u64, String, Option<String>, String),
) -> Violation {
    Violation::BalanceMismatch {
        partner_id,
        currency,
        balance,
        entries_sum,
    }
}

fn broken(
    (entry_id, partner_id, currency, balance_after, expected): (u64, u64, String, String, String),
) -> Violation {
    Violation::BrokenChain {
        entry_id,
        partner_id,
        currency,
        balance_after,
        expected,
    }
}

/// Seed 001 §7 ("no withdrawal with two keyed DEBITs"), for every reference and entry type.
pub async fn duplicate_keyed_entries(
    conn: &mut MySqlConnection,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(String, u64, String, String)> = sqlx::query_as(
        "SELECT reference_type, reference_id, entry_type, \
                CAST(GROUP_CONCAT(id ORDER BY id) AS CHAR) \
         FROM ledger_entries \
         WHERE idem_key IS NOT NULL \
         GROUP BY reference_type, reference_id, entry_type \
         HAVING COUNT(*) > 1 \
         ORDER BY reference_type, reference_id, entry_type",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(duplicate).collect())
}

/// Keys must name their own entry (what [`super::IdemKey`] guarantees for new rows).
pub async fn misplaced_idem_keys(
    conn: &mut MySqlConnection,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, String, String, String, u64)> = sqlx::query_as(concat!(
        "SELECT id, idem_key, entry_type, reference_type, reference_id \
             FROM ledger_entries WHERE idem_key IS NOT NULL",
        misplaced_key!(),
        " ORDER BY id"
    ))
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(misplaced).collect())
}

/// Every balance row equals the signed sum of its entries, and no entries lack a balance row
/// (the foreign key forbids it, unless someone loaded rows with `foreign_key_checks = 0`).
pub async fn balance_mismatches(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, String, Option<String>, String)> = sqlx::query_as(
        "SELECT b.partner_id, b.currency, CAST(b.balance AS CHAR), \
                CAST(COALESCE(s.total, 0) AS CHAR) \
         FROM partner_balances b \
         LEFT JOIN ( \
             SELECT partner_id, currency, \
                    SUM(CASE WHEN entry_type = 'CREDIT' THEN amount ELSE -amount END) AS total \
             FROM ledger_entries GROUP BY partner_id, currency) s \
           ON s.partner_id = b.partner_id AND s.currency = b.currency \
         WHERE b.balance <> COALESCE(s.total, 0) \
         UNION ALL \
         SELECT s.partner_id, s.currency, NULL, CAST(s.total AS CHAR) \
         FROM ( \
             SELECT partner_id, currency, \
                    SUM(CASE WHEN entry_type = 'CREDIT' THEN amount ELSE -amount END) AS total \
             FROM ledger_entries GROUP BY partner_id, currency) s \
         LEFT JOIN partner_balances b \
           ON b.partner_id = s.partner_id AND b.currency = s.currency \
         WHERE b.partner_id IS NULL \
         ORDER BY 1, 2",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(mismatch).collect())
}

/// Set-based chain check: `LAG` over each (partner, currency) in id order; the first entry
/// starts from zero. A corrupted `balance_after` shows up on its own entry and on the next.
pub async fn broken_chains(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, u64, String, String, String)> = sqlx::query_as(
        "SELECT id, partner_id, currency, CAST(balance_after AS CHAR), CAST(expected AS CHAR) \
         FROM ( \
             SELECT id, partner_id, currency, balance_after, \
                    COALESCE(LAG(balance_after) OVER ( \
                                 PARTITION BY partner_id, currency ORDER BY id), 0) \
                    + CASE WHEN entry_type = 'CREDIT' THEN amount ELSE -amount END AS expected \
             FROM ledger_entries) chain \
         WHERE balance_after <> expected \
         ORDER BY id",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(broken).collect())
}

/// [`duplicate_keyed_entries`] for the references keyed in `window`.
pub async fn recent_duplicate_keyed_entries(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(String, u64, String, String)> = sqlx::query_as(
        "SELECT STRAIGHT_JOIN e.reference_type, e.reference_id, e.entry_type, \
                CAST(GROUP_CONCAT(e.id ORDER BY e.id) AS CHAR) \
         FROM (SELECT DISTINCT reference_type, reference_id \
               FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
               WHERE created_at >= ? AND idem_key IS NOT NULL) touched \
         JOIN ledger_entries e \
           ON e.reference_type = touched.reference_type \
          AND e.reference_id = touched.reference_id \
         WHERE e.idem_key IS NOT NULL \
         GROUP BY e.reference_type, e.reference_id, e.entry_type \
         HAVING COUNT(*) > 1 \
         ORDER BY e.reference_type, e.reference_id, e.entry_type",
    )
    .bind(window.since)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(duplicate).collect())
}

/// [`misplaced_idem_keys`] among the entries written in `window`.
pub async fn recent_misplaced_idem_keys(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, String, String, String, u64)> = sqlx::query_as(concat!(
        "SELECT id, idem_key, entry_type, reference_type, reference_id \
             FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
             WHERE created_at >= ? AND idem_key IS NOT NULL",
        misplaced_key!(),
        " ORDER BY id"
    ))
    .bind(window.since)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(misplaced).collect())
}

/// The balances of the (partner, currency) pairs `window` touched against their last entry's
/// `balance_after` (`entries_sum` then names that value: the sum of the entries as long as
/// the chain holds, which [`recent_broken_chains`] checks).
pub async fn recent_balance_mismatches(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, String, Option<String>, String)> = sqlx::query_as(
        "SELECT last.partner_id, last.currency, CAST(b.balance AS CHAR), \
                CAST(last.balance_after AS CHAR) \
         FROM (SELECT partner_id, currency, MAX(id) AS id \
               FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
               WHERE created_at >= ? GROUP BY partner_id, currency) touched \
         JOIN ledger_entries last ON last.id = touched.id \
         LEFT JOIN partner_balances b \
           ON b.partner_id = last.partner_id AND b.currency = last.currency \
         WHERE b.balance IS NULL OR b.balance <> last.balance_after \
         ORDER BY 1, 2",
    )
    .bind(window.since)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(mismatch).collect())
}

/// [`broken_chains`] for the entries written in `window`: per (partner, currency) the window
/// touched, its chain from the entry just before the window (one index dive on
/// `index_ledger_entries_chain`) through the window's entries. Every statement reads the
/// window's rows plus one per pair, whatever the table's size; constants per pair keep the
/// plan a range scan (a correlated "previous entry" subquery let the optimizer pick scans of
/// a partner's whole chain).
pub async fn recent_broken_chains(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    let touched: Vec<(u64, String, u64)> = sqlx::query_as(
        "SELECT partner_id, currency, MIN(id) \
         FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) WHERE created_at >= ? \
         GROUP BY partner_id, currency ORDER BY 1, 2",
    )
    .bind(window.since)
    .fetch_all(&mut *conn)
    .await?;
    let mut found = Vec::new();
    for (partner_id, currency, first_id) in touched {
        let rows: Vec<(u64, String, String)> = sqlx::query_as(
            "SELECT id, CAST(balance_after AS CHAR), CAST(expected AS CHAR) FROM ( \
                 SELECT id, balance_after, \
                        COALESCE(LAG(balance_after) OVER (ORDER BY id), 0) \
                        + CASE WHEN entry_type = 'CREDIT' THEN amount ELSE -amount END \
                          AS expected \
                 FROM ledger_entries \
                 WHERE partner_id = ? AND currency = ? \
                   AND id >= COALESCE((SELECT MAX(id) FROM ledger_entries \
                                       WHERE partner_id = ? AND currency = ? AND id < ?), 0)) \
                 chain \
             WHERE id >= ? AND balance_after <> expected ORDER BY id",
        )
        .bind(partner_id)
        .bind(&currency)
        .bind(partner_id)
        .bind(&currency)
        .bind(first_id)
        .bind(first_id)
        .fetch_all(&mut *conn)
        .await?;
        found.extend(rows.into_iter().map(|(entry_id, balance_after, expected)| {
            broken((
                entry_id,
                partner_id,
                currency.clone(),
                balance_after,
                expected,
            ))
        }));
    }
    found.sort_by_key(|violation| match violation {
        Violation::BrokenChain { entry_id, .. } => *entry_id,
        _ => 0,
    });
    Ok(found)
}
