//! The NEW dead letters grouped by function and reason, with the money they hold up.
//!
//! The money comes from each letter's triage (the amount is on the row the message refers
//! to, not in the message): summed per partner and currency over the letters a replay could
//! still apply (*safe* or *needs a human*; an *already applied* letter holds nothing up), and
//! listed biggest first. Triage reads one row per letter, so the sums cover at most
//! [`EXPOSURE_SCAN_LIMIT`] letters, oldest first; `exposure_complete` says whether that was
//! all of them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use paybus_platform::triage::Verdict;
use serde::Serialize;
use sqlx::MySqlConnection;

use crate::{DeadLetterError, Triager, letter};

/// The most letters whose triage one overview reads.
pub const EXPOSURE_SCAN_LIMIT: u32 = 5_000;

/// Money held up by dead letters, for one partner (`None`: members' bonuses) and currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExposureSum {
    pub partner_id: Option<u64>,
    pub currency: String,
    pub amount: Amount,
    /// How many letters it sums.
    pub letters: u64,
}

/// The NEW letters of one function and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub function: String,
    pub reason: String,
    pub count: u64,
    pub first_failed_at: DateTime<Utc>,
    pub last_failed_at: DateTime<Utc>,
    /// Biggest amount first.
    pub exposure: Vec<ExposureSum>,
}

/// Every group (most letters first) and the exposure of all of them (biggest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overview {
    pub groups: Vec<Group>,
    pub exposure: Vec<ExposureSum>,
    /// False when there were more NEW letters than [`EXPOSURE_SCAN_LIMIT`]: the sums are a
    /// lower bound.
    pub exposure_complete: bool,
}

type ExposureKey = (Option<u64>, String);

/// function, reason, count, first and last failed_at.
type GroupRow = (String, String, i64, DateTime<Utc>, DateTime<Utc>);

#[derive(Default)]
struct Sums(BTreeMap<ExposureKey, (Amount, u64)>);

impl Sums {
    fn add(&mut self, partner_id: Option<u64>, currency: &str, amount: Amount) {
        let entry = self
            .0
            .entry((partner_id, currency.to_owned()))
            .or_insert((Amount::ZERO, 0));
        // An overflow of DECIMAL(36,18) in a sum of dead letters is not credible; saturating
        // at the first term keeps the view up rather than failing it.
        entry.0 = entry.0.checked_add(amount).unwrap_or(entry.0);
        entry.1 += 1;
    }

    fn biggest_first(self) -> Vec<ExposureSum> {
        let mut sums: Vec<ExposureSum> = self
            .0
            .into_iter()
            .map(|((partner_id, currency), (amount, letters))| ExposureSum {
                partner_id,
                currency,
                amount,
                letters,
            })
            .collect();
        sums.sort_by(|a, b| {
            b.amount
                .cmp(&a.amount)
                .then_with(|| a.currency.cmp(&b.currency))
                .then_with(|| a.partner_id.cmp(&b.partner_id))
        });
        sums
    }
}

/// The overview of the NEW letters.
pub async fn overview(
    conn: &mut MySqlConnection,
    triager: &Triager,
) -> Result<Overview, DeadLetterError> {
    let rows: Vec<GroupRow> = sqlx::query_as(
        "SELECT function_name, reason, COUNT(*), MIN(failed_at), MAX(failed_at) \
         FROM dead_letters WHERE status = 'NEW' \
         GROUP BY function_name, reason \
         ORDER BY COUNT(*) DESC, function_name, reason",
    )
    .fetch_all(&mut *conn)
    .await?;
    let total: i64 = rows.iter().map(|row| row.2).sum();

    let ids: Vec<u64> =
        sqlx::query_scalar("SELECT id FROM dead_letters WHERE status = 'NEW' ORDER BY id LIMIT ?")
            .bind(EXPOSURE_SCAN_LIMIT)
            .fetch_all(&mut *conn)
            .await?;
    let mut by_group: BTreeMap<(String, String), Sums> = BTreeMap::new();
    let mut all = Sums::default();
    for id in &ids {
        let Some((letter, body)) = letter::find(conn, *id).await? else {
            continue;
        };
        let triage = triager.triage(conn, &letter, &body).await?;
        let Some(exposure) = triage.exposure else {
            continue;
        };
        if triage.verdict == Verdict::AlreadyApplied {
            continue;
        }
        all.add(exposure.partner_id, &exposure.currency, exposure.amount);
        by_group
            .entry((letter.function_name, letter.reason))
            .or_default()
            .add(exposure.partner_id, &exposure.currency, exposure.amount);
    }

    let groups = rows
        .into_iter()
        .map(|(function, reason, count, first, last)| {
            let exposure = by_group
                .remove(&(function.clone(), reason.clone()))
                .unwrap_or_default()
                .biggest_first();
            Group {
                function,
                reason,
                count: u64::try_from(count).unwrap_or(0),
                first_failed_at: first,
                last_failed_at: last,
                exposure,
            }
        })
        .collect();
    Ok(Overview {
        groups,
        exposure: all.biggest_first(),
        exposure_complete: total <= i64::from(EXPOSURE_SCAN_LIMIT),
    })
}
