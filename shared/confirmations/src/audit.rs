//! W2's invariants about the ledger entries its confirmations owe (docs/workflows/confirmations.md, seed 001 §7),
//! next to the ledger's own (`paybus_ledger::audit`): plain SQL, one statement per check.
//!
//! | check | invariant |
//! | --- | --- |
//! | `withdrawal_debits` | every CONFIRMED NORMAL withdrawal has its `WDR_CONFIRM` DEBIT for its partner, currency and amount; no other withdrawal has one |
//! | `withdrawal_debit_count` | a CONFIRMED NORMAL withdrawal has at most one confirmation DEBIT: a DEBIT of its whole amount referencing it, keyed `WDR_CONFIRM:{id}` or unkeyed (the seed's double debit carried no key; P2P legs and corrections are other amounts or other keys) |
//! | `deposit_entries` | every CONFIRMED deposit has its `DEP_CREDIT` of `amount`, and its `DEP_FEE` of `fee` when `fee > 0` (none otherwise); no other deposit has either |
//!
//! Each check has a `recent` form for the continuous auditor: the same SQL over the withdrawals
//! or deposits the window touched — moved to CONFIRMED (or changed) since its start
//! (`index_withdrawals_by_status_age`, `index_deposits_recent`), or referenced by a ledger entry
//! written since (`index_ledger_entries_recent`) — and the keyed entries written since or
//! belonging to those rows. Its cost follows the window, not the tables.

use std::fmt;

use paybus_ops::audit::{Check, Finding, Scope, Window};
use serde::Serialize;
use sqlx::MySqlConnection;

/// W2's checks, in the order `paybus audit` runs them.
pub const CHECKS: &[Check] = &[
    paybus_ops::audit_check!("withdrawal_debits", withdrawal_debits, recent: recent_withdrawal_debits),
    paybus_ops::audit_check!("withdrawal_debit_count", withdrawal_debit_count, recent: recent_withdrawal_debit_count),
    paybus_ops::audit_check!("deposit_entries", deposit_entries, recent: recent_deposit_entries),
];

/// One broken W2 invariant; [`fmt::Display`] renders it as one line naming the ids involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Violation {
    /// A CONFIRMED NORMAL withdrawal without its `WDR_CONFIRM` DEBIT.
    WithdrawalDebitMissing { withdrawal_id: u64 },
    /// The `WDR_CONFIRM` DEBIT of a withdrawal disagrees with it on partner, currency or amount.
    WithdrawalDebitMismatch {
        withdrawal_id: u64,
        entry_id: u64,
        expected: String,
        found: String,
    },
    /// A `WDR_CONFIRM` DEBIT for a withdrawal that is not a CONFIRMED NORMAL one (a
    /// SETTLEMENT_WITHDRAW or SELF_TRANSFER, one not confirmed, or none at all).
    UnexpectedWithdrawalDebit {
        entry_id: u64,
        withdrawal_id: u64,
        kind: Option<String>,
        status: Option<String>,
    },
    /// A CONFIRMED NORMAL withdrawal with more than one DEBIT of its whole amount (keyed or
    /// not).
    WithdrawalDebitedTwice { withdrawal_id: u64, debits: i64 },
    /// A CONFIRMED deposit without its `DEP_CREDIT` CREDIT.
    DepositCreditMissing { deposit_id: u64 },
    /// A CONFIRMED deposit with `fee > 0` without its `DEP_FEE` FEE.
    DepositFeeMissing { deposit_id: u64 },
    /// The `DEP_CREDIT` or `DEP_FEE` entry of a deposit disagrees with it on partner, currency
    /// or amount (a FEE on a deposit without fee included).
    DepositEntryMismatch {
        deposit_id: u64,
        entry_id: u64,
        idem_key: String,
        expected: String,
        found: String,
    },
    /// A `DEP_CREDIT` / `DEP_FEE` entry for a deposit that is not CONFIRMED (or does not exist).
    UnexpectedDepositEntry {
        entry_id: u64,
        idem_key: String,
        deposit_id: u64,
        status: Option<String>,
    },
}

impl Finding for Violation {
    fn check(&self) -> &'static str {
        match self {
            Violation::WithdrawalDebitMissing { .. } => "withdrawal_debit_missing",
            Violation::WithdrawalDebitMismatch { .. } => "withdrawal_debit_mismatch",
            Violation::UnexpectedWithdrawalDebit { .. } => "unexpected_withdrawal_debit",
            Violation::WithdrawalDebitedTwice { .. } => "withdrawal_debited_twice",
            Violation::DepositCreditMissing { .. } => "deposit_credit_missing",
            Violation::DepositFeeMissing { .. } => "deposit_fee_missing",
            Violation::DepositEntryMismatch { .. } => "deposit_entry_mismatch",
            Violation::UnexpectedDepositEntry { .. } => "unexpected_deposit_entry",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.check())?;
        match self {
            Violation::WithdrawalDebitMissing { withdrawal_id } => write!(
                f,
                "withdrawal {withdrawal_id} is CONFIRMED NORMAL but has no \
                 WDR_CONFIRM:{withdrawal_id} DEBIT"
            ),
            Violation::WithdrawalDebitMismatch {
                withdrawal_id,
                entry_id,
                expected,
                found,
            } => write!(
                f,
                "entry {entry_id} debits {found} for withdrawal {withdrawal_id}, which is \
                 {expected}"
            ),
            Violation::UnexpectedWithdrawalDebit {
                entry_id,
                withdrawal_id,
                kind,
                status,
            } => match (kind, status) {
                (Some(kind), Some(status)) => write!(
                    f,
                    "entry {entry_id} is a confirmation DEBIT of withdrawal {withdrawal_id}, \
                     which is {status} {kind}"
                ),
                _ => write!(
                    f,
                    "entry {entry_id} is a confirmation DEBIT of withdrawal {withdrawal_id}, \
                     which does not exist"
                ),
            },
            Violation::WithdrawalDebitedTwice {
                withdrawal_id,
                debits,
            } => write!(
                f,
                "withdrawal {withdrawal_id} is debited its amount {debits} times (once is owed)"
            ),
            Violation::DepositCreditMissing { deposit_id } => write!(
                f,
                "deposit {deposit_id} is CONFIRMED but has no DEP_CREDIT:{deposit_id} CREDIT"
            ),
            Violation::DepositFeeMissing { deposit_id } => write!(
                f,
                "deposit {deposit_id} is CONFIRMED with a fee but has no DEP_FEE:{deposit_id} FEE"
            ),
            Violation::DepositEntryMismatch {
                deposit_id,
                entry_id,
                idem_key,
                expected,
                found,
            } => write!(
                f,
                "entry {entry_id} ({idem_key}) records {found} for deposit {deposit_id}, \
                 expected {expected}"
            ),
            Violation::UnexpectedDepositEntry {
                entry_id,
                idem_key,
                deposit_id,
                status,
            } => match status {
                Some(status) => write!(
                    f,
                    "entry {entry_id} ({idem_key}) belongs to deposit {deposit_id}, which is \
                     {status}"
                ),
                None => write!(
                    f,
                    "entry {entry_id} ({idem_key}) belongs to deposit {deposit_id}, which does \
                     not exist"
                ),
            },
        }
    }
}

/// The withdrawals a window touched: moved to CONFIRMED (or changed while CONFIRMED) since its
/// start, or referenced by a ledger entry written since.
const TOUCHED_WITHDRAWALS: &str = " JOIN ( \
        SELECT id FROM withdrawals WHERE status = 'CONFIRMED' AND updated_at >= ? \
        UNION SELECT reference_id FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
              WHERE created_at >= ? AND reference_type = 'WITHDRAWAL') touched \
     ON touched.id = w.id";

/// The confirmation DEBITs a window touched: written since its start, or keyed to a withdrawal
/// changed since (whatever its status now).
const TOUCHED_WITHDRAWAL_DEBITS: &str = " JOIN ( \
        SELECT id FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
              WHERE created_at >= ? \
        UNION SELECT le.id FROM withdrawals tw \
              JOIN ledger_entries le ON le.idem_key = CONCAT('WDR_CONFIRM:', tw.id) \
              WHERE tw.status IN ('REQUESTED', 'PROCESSING', 'BROADCASTING', 'STALE', \
                                  'CONFIRMED', 'FAILED') \
                AND tw.updated_at >= ?) touched \
     ON touched.id = e.id";

/// The deposits a window touched: changed since its start, or referenced by a ledger entry
/// written since.
const TOUCHED_DEPOSITS: &str = " JOIN ( \
        SELECT id FROM deposits FORCE INDEX (index_deposits_recent) WHERE updated_at >= ? \
        UNION SELECT reference_id FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
              WHERE created_at >= ? AND reference_type = 'DEPOSIT') touched \
     ON touched.id = d.id";

/// The keyed deposit entries a window touched: written since its start, or keyed to a deposit
/// changed since.
const TOUCHED_DEPOSIT_ENTRIES: &str = " JOIN ( \
        SELECT id FROM ledger_entries FORCE INDEX (index_ledger_entries_recent) \
              WHERE created_at >= ? \
        UNION SELECT le.id FROM deposits td FORCE INDEX (index_deposits_recent) \
              JOIN ledger_entries le ON le.idem_key IN (CONCAT('DEP_CREDIT:', td.id), \
                                                         CONCAT('DEP_FEE:', td.id)) \
              WHERE td.updated_at >= ?) touched \
     ON touched.id = e.id";

/// Withdrawals and their confirmation DEBITs (`WDR_CONFIRM:{id}`), both directions.
pub async fn withdrawal_debits(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    withdrawal_debits_in(conn, Scope::All).await
}

/// [`withdrawal_debits`] over the rows `window` touched.
pub async fn recent_withdrawal_debits(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    withdrawal_debits_in(conn, Scope::Recent(window)).await
}

async fn withdrawal_debits_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    // CONFIRMED NORMAL withdrawals whose DEBIT is missing or disagrees with them. The key is
    // unique, so the join finds at most one entry.
    let rows: Vec<(u64, String, Option<u64>, Option<String>)> = scope
        .fetch(
            &mut *conn,
            "SELECT w.id, \
                CONCAT(CAST(w.amount AS CHAR), ' ', w.currency, ' of partner ', w.partner_id), \
                e.id, \
                CONCAT(e.entry_type, ' ', CAST(e.amount AS CHAR), ' ', e.currency, \
                       ' of partner ', e.partner_id) \
         FROM withdrawals w {recent} \
         LEFT JOIN ledger_entries e ON e.idem_key = CONCAT('WDR_CONFIRM:', w.id) \
         WHERE w.status = 'CONFIRMED' AND w.kind = 'NORMAL' \
           AND (e.id IS NULL OR e.partner_id <> w.partner_id OR e.currency <> w.currency \
                OR e.amount <> w.amount OR e.entry_type <> 'DEBIT') \
         ORDER BY w.id",
            TOUCHED_WITHDRAWALS,
        )
        .await?;
    let mut violations: Vec<Violation> = rows
        .into_iter()
        .map(|(withdrawal_id, expected, entry, found)| match entry {
            None => Violation::WithdrawalDebitMissing { withdrawal_id },
            Some(entry_id) => Violation::WithdrawalDebitMismatch {
                withdrawal_id,
                entry_id,
                expected,
                found: found.unwrap_or_default(),
            },
        })
        .collect();

    // Confirmation DEBITs of withdrawals that must not have one.
    let rows: Vec<(u64, u64, Option<String>, Option<String>)> = scope
        .fetch(
            &mut *conn,
            "SELECT e.id, CAST(SUBSTRING_INDEX(e.idem_key, ':', -1) AS UNSIGNED), w.kind, \
                    w.status \
             FROM ledger_entries e {recent} \
             LEFT JOIN withdrawals w \
               ON w.id = CAST(SUBSTRING_INDEX(e.idem_key, ':', -1) AS UNSIGNED) \
             WHERE e.idem_key LIKE 'WDR|_CONFIRM:%' ESCAPE '|' \
               AND (w.id IS NULL OR w.kind <> 'NORMAL' OR w.status <> 'CONFIRMED') \
             ORDER BY e.id",
            TOUCHED_WITHDRAWAL_DEBITS,
        )
        .await?;
    violations.extend(
        rows.into_iter()
            .map(
                |(entry_id, withdrawal_id, kind, status)| Violation::UnexpectedWithdrawalDebit {
                    entry_id,
                    withdrawal_id,
                    kind,
                    status,
                },
            ),
    );
    Ok(violations)
}

/// CONFIRMED NORMAL withdrawals debited their whole amount more than once. The
/// `WDR_CONFIRM` key makes a second keyed DEBIT impossible; this finds the unkeyed ones a design
/// without the key (the seed's `onTxConfirmed`) writes next to it or instead of it.
pub async fn withdrawal_debit_count(
    conn: &mut MySqlConnection,
) -> Result<Vec<Violation>, sqlx::Error> {
    withdrawal_debit_count_in(conn, Scope::All).await
}

/// [`withdrawal_debit_count`] over the withdrawals `window` touched.
pub async fn recent_withdrawal_debit_count(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    withdrawal_debit_count_in(conn, Scope::Recent(window)).await
}

async fn withdrawal_debit_count_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<(u64, i64)> = scope
        .fetch(
            conn,
            "SELECT w.id, COUNT(*) FROM withdrawals w {recent} \
         JOIN ledger_entries e ON e.reference_type = 'WITHDRAWAL' AND e.reference_id = w.id \
         WHERE w.status = 'CONFIRMED' AND w.kind = 'NORMAL' \
           AND e.entry_type = 'DEBIT' AND e.amount = w.amount \
           AND (e.idem_key IS NULL OR e.idem_key = CONCAT('WDR_CONFIRM:', w.id)) \
         GROUP BY w.id HAVING COUNT(*) > 1 ORDER BY w.id",
            TOUCHED_WITHDRAWALS,
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(withdrawal_id, debits)| Violation::WithdrawalDebitedTwice {
                withdrawal_id,
                debits,
            },
        )
        .collect())
}

/// Deposits and their confirmation CREDIT (`DEP_CREDIT:{id}`, of `amount`) and FEE
/// (`DEP_FEE:{id}`, of `fee`, present exactly when `fee > 0`), both directions.
pub async fn deposit_entries(conn: &mut MySqlConnection) -> Result<Vec<Violation>, sqlx::Error> {
    deposit_entries_in(conn, Scope::All).await
}

/// [`deposit_entries`] over the deposits and entries `window` touched.
pub async fn recent_deposit_entries(
    conn: &mut MySqlConnection,
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    deposit_entries_in(conn, Scope::Recent(window)).await
}

async fn deposit_entries_in(
    conn: &mut MySqlConnection,
    scope: Scope,
) -> Result<Vec<Violation>, sqlx::Error> {
    // The CREDIT: one per CONFIRMED deposit, of the deposit's amount.
    let mut violations = deposit_entry_check(
        conn,
        scope,
        "SELECT d.id AS deposit_id, \
                CONCAT('CREDIT ', CAST(d.amount AS CHAR), ' ', d.currency, \
                       ' of partner ', d.partner_id) AS expected, \
                e.id AS entry_id, e.idem_key, \
                CONCAT(e.entry_type, ' ', CAST(e.amount AS CHAR), ' ', e.currency, \
                       ' of partner ', e.partner_id) AS found \
         FROM deposits d {recent} \
         LEFT JOIN ledger_entries e ON e.idem_key = CONCAT('DEP_CREDIT:', d.id) \
         WHERE d.status = 'CONFIRMED' \
           AND (e.id IS NULL OR e.partner_id <> d.partner_id OR e.currency <> d.currency \
                OR e.amount <> d.amount OR e.entry_type <> 'CREDIT') \
         ORDER BY d.id",
        |deposit_id| Violation::DepositCreditMissing { deposit_id },
    )
    .await?;

    // The FEE: one per CONFIRMED deposit with fee > 0, of the fee; none when the fee is zero
    // (a FEE entry is always positive, so it disagrees with a zero fee).
    violations.extend(
        deposit_entry_check(
            conn,
            scope,
            "SELECT d.id AS deposit_id, \
                    CONCAT('FEE ', CAST(d.fee AS CHAR), ' ', d.currency, \
                           ' of partner ', d.partner_id) AS expected, \
                    e.id AS entry_id, e.idem_key, \
                    CONCAT(e.entry_type, ' ', CAST(e.amount AS CHAR), ' ', e.currency, \
                           ' of partner ', e.partner_id) AS found \
             FROM deposits d {recent} \
             LEFT JOIN ledger_entries e ON e.idem_key = CONCAT('DEP_FEE:', d.id) \
             WHERE d.status = 'CONFIRMED' \
               AND ((e.id IS NULL AND d.fee > 0) \
                    OR (e.id IS NOT NULL AND (e.partner_id <> d.partner_id \
                        OR e.currency <> d.currency OR e.amount <> d.fee \
                        OR e.entry_type <> 'FEE'))) \
             ORDER BY d.id",
            |deposit_id| Violation::DepositFeeMissing { deposit_id },
        )
        .await?,
    );

    // Keyed deposit entries whose deposit is not CONFIRMED.
    let rows: Vec<(u64, String, u64, Option<String>)> = scope
        .fetch(
            &mut *conn,
            "SELECT e.id, e.idem_key, CAST(SUBSTRING_INDEX(e.idem_key, ':', -1) AS UNSIGNED), \
                d.status \
         FROM ledger_entries e {recent} \
         LEFT JOIN deposits d \
           ON d.id = CAST(SUBSTRING_INDEX(e.idem_key, ':', -1) AS UNSIGNED) \
         WHERE (e.idem_key LIKE 'DEP|_CREDIT:%' ESCAPE '|' \
                OR e.idem_key LIKE 'DEP|_FEE:%' ESCAPE '|') \
           AND (d.id IS NULL OR d.status <> 'CONFIRMED') \
         ORDER BY e.id",
            TOUCHED_DEPOSIT_ENTRIES,
        )
        .await?;
    violations.extend(
        rows.into_iter()
            .map(
                |(entry_id, idem_key, deposit_id, status)| Violation::UnexpectedDepositEntry {
                    entry_id,
                    idem_key,
                    deposit_id,
                    status,
                },
            ),
    );
    Ok(violations)
}

/// A CONFIRMED deposit and the keyed entry its check's join found for it, if any.
#[derive(sqlx::FromRow)]
struct DepositEntryRow {
    deposit_id: u64,
    expected: String,
    entry_id: Option<u64>,
    idem_key: Option<String>,
    found: Option<String>,
}

/// Runs one side of the deposit check: no entry is `missing(deposit_id)`, an entry is a
/// mismatch.
async fn deposit_entry_check(
    conn: &mut MySqlConnection,
    scope: Scope,
    sql: &'static str,
    missing: fn(u64) -> Violation,
) -> Result<Vec<Violation>, sqlx::Error> {
    let rows: Vec<DepositEntryRow> = scope.fetch(conn, sql, TOUCHED_DEPOSITS).await?;
    Ok(rows
        .into_iter()
        .map(|row| match row.entry_id {
            None => missing(row.deposit_id),
            Some(entry_id) => Violation::DepositEntryMismatch {
                deposit_id: row.deposit_id,
                entry_id,
                idem_key: row.idem_key.unwrap_or_default(),
                expected: row.expected,
                found: row.found.unwrap_or_default(),
            },
        })
        .collect())
}
