//! The NEW dead letters grouped by function and reason, with the money they hold up.
//!
//! The money comes from each letter's triage (the amount is on the row the message refers
//! to, not in the message): summed per partner and currency over the rows a replay could
//! still apply (*safe* or *needs a human*; an *already applied* letter holds nothing up), each
//! row **once** however many letters refer to it (three copies of one confirmation anomaly
//! hold one withdrawal's money up, not three times it), the part that waits for a human shown
//! apart, and listed biggest first. The groups come biggest exposure first, then most
//! failures. Triage reads one row per letter, so the sums cover at most
//! [`EXPOSURE_SCAN_LIMIT`] letters, oldest first; `exposure_complete` says whether that was
//! all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use paybus_bus::dead_letter::group_counts;
use paybus_money::Amount;
use paybus_ops::triage::{Exposure, Triage, Verdict};
use serde::Serialize;
use sqlx::{Connection, MySqlPool};

use crate::{
    DeadLetterError, Triager,
    letter::{self, DeadLetter},
};

/// The most letters whose triage one overview reads. 5,000 make the groups page take 0.6 s
/// or more once there are that many NEW letters (`paybus-lab bench ops-queries`): a triage
/// is one or two reads per distinct message, and the page must answer within 200 ms.
pub const EXPOSURE_SCAN_LIMIT: u32 = 1_000;

/// Letters read per statement by the scan: bodies can be large (a MEDIUMBLOB each), so a
/// page, not the whole scan, is in memory at once.
const SCAN_PAGE: u32 = 200;

/// Money held up by dead letters, for one partner (`None`: members' bonuses) and currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExposureSum {
    pub partner_id: Option<u64>,
    pub currency: String,
    pub amount: Amount,
    /// Of `amount`, what letters whose verdict is *needs a human* hold up: no replay moves it
    /// until someone decides.
    pub needs_a_human: Amount,
    /// How many distinct rows (withdrawals, deposits, orders, jobs) it sums.
    pub rows: u64,
    /// How many letters refer to them.
    pub letters: u64,
}

/// The NEW letters of one function and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub function: String,
    pub reason: String,
    /// Letters in the group.
    pub count: u64,
    /// Failures they stand for: a letter counts each time its message failed again.
    pub failures: u64,
    pub first_failed_at: DateTime<Utc>,
    pub last_failed_at: DateTime<Utc>,
    /// Biggest amount first.
    pub exposure: Vec<ExposureSum>,
}

/// Every group (biggest exposure first) and the exposure of all of them (biggest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overview {
    pub groups: Vec<Group>,
    pub exposure: Vec<ExposureSum>,
    /// False when there were more NEW letters than [`EXPOSURE_SCAN_LIMIT`]: the sums are a
    /// lower bound.
    pub exposure_complete: bool,
}

type ExposureKey = (Option<u64>, String);

/// What a letter's triage depends on: its function, its routing key and its message's data
/// (a function triages the envelope's `data`; its id and time are never read). Copies of one
/// confirmation — a storm's usual shape — are triaged once per overview, not once per copy.
/// A body that is not an envelope is keyed by its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TriageKey {
    function: String,
    routing_key: String,
    data: Vec<u8>,
}

impl TriageKey {
    fn of(letter: &DeadLetter, body: &[u8]) -> Self {
        let data = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|envelope| envelope.get("data").map(|data| format!("d{data}")))
            .map_or_else(|| [b"r".as_slice(), body].concat(), String::into_bytes);
        Self {
            function: letter.function_name.clone(),
            routing_key: letter.routing_key.clone(),
            data,
        }
    }
}

/// function, reason, and its NEW letters' first failure, last failure and latest
/// `last_failed_at` (`None` when the group has no NEW letter).
type GroupTimes = (
    String,
    String,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// function, reason, letters, failures, first and last failed_at.
type GroupRow = (String, String, i64, i64, DateTime<Utc>, DateTime<Utc>);

/// Each group's figures, in one snapshot: its letters and failures from the counts every
/// write keeps ([`group_counts`]), its first and last failure by three point reads per group
/// at the ends of the (function, reason, NEW) range of two indexes. The groups themselves come
/// from a skip over those indexes' distinct (function, reason) prefixes, NEW or not (a few
/// dozen index reads), so a group the counts miss still shows: the page shows the letters
/// that are there, and the audit check `dead_letter_group_counts` reports the drift.
///
/// Why not a `GROUP BY` with `MIN(failed_at)` over the NEW letters: it looks like the same
/// skip on paper but reads the whole NEW range on MariaDB 10.11, 2.4 s at 5,000,000 letters
/// (`paybus-lab bench ops-queries`), where these point reads take milliseconds.
async fn group_rows(conn: &mut sqlx::MySqlConnection) -> Result<Vec<GroupRow>, DeadLetterError> {
    let mut tx = conn.begin().await?;
    let counts: HashMap<(String, String), (i64, i64)> = group_counts::read(&mut tx)
        .await?
        .into_iter()
        .map(|group| {
            (
                (group.function_name, group.reason),
                (group.letters, group.failures),
            )
        })
        .collect();
    // The skip is forced: the optimizer's estimates at millions of rows cannot be trusted to
    // pick it, and any other plan reads every letter. NULLs sort last in a descending order,
    // so the last `last_failed_at` is the latest one set.
    let times: Vec<GroupTimes> = sqlx::query_as(
        "SELECT g.function_name, g.reason, \
                    (SELECT d.failed_at FROM dead_letters d \
                     FORCE INDEX (index_dead_letters_groups_first_failure) \
                     WHERE d.function_name = g.function_name AND d.reason = g.reason \
                       AND d.status = 'NEW' ORDER BY d.failed_at LIMIT 1), \
                    (SELECT d.failed_at FROM dead_letters d \
                     FORCE INDEX (index_dead_letters_groups_first_failure) \
                     WHERE d.function_name = g.function_name AND d.reason = g.reason \
                       AND d.status = 'NEW' ORDER BY d.failed_at DESC LIMIT 1), \
                    (SELECT d.last_failed_at FROM dead_letters d \
                     FORCE INDEX (index_dead_letters_groups_last_failure) \
                     WHERE d.function_name = g.function_name AND d.reason = g.reason \
                       AND d.status = 'NEW' ORDER BY d.last_failed_at DESC LIMIT 1) \
             FROM (SELECT function_name, reason FROM dead_letters \
                   FORCE INDEX (index_dead_letters_groups_first_failure) \
                   GROUP BY function_name, reason) g",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let rows: Vec<GroupRow> = times
        .into_iter()
        .filter_map(|(function, reason, first, last_first, last_again)| {
            let (first, last_first) = (first?, last_first?);
            let key = (function, reason);
            let (letters, failures) = counts.get(&key).copied().unwrap_or_default();
            // A letter that failed once before failures were counted has no last failure.
            let last = last_again.map_or(last_first, |last| last.max(last_first));
            Some((key.0, key.1, letters, failures, first, last))
        })
        .collect();
    let counted = counts.values().filter(|(letters, _)| *letters != 0).count();
    if counted != rows.len() || rows.iter().any(|row| row.2 <= 0) {
        tracing::warn!(
            counted,
            with_letters = rows.len(),
            "the dead-letter group counts disagree with the NEW letters (run paybus audit)"
        );
    }
    Ok(rows)
}

#[derive(Default)]
struct Sum {
    amount: Amount,
    needs_a_human: Amount,
    rows: u64,
    letters: u64,
}

/// Sums over rows, each row counted once: the first letter that names it brings its money,
/// the others only count as letters.
#[derive(Default)]
struct Sums {
    sums: BTreeMap<ExposureKey, Sum>,
    rows: BTreeSet<(&'static str, u64)>,
}

// An overflow of DECIMAL(36,18) in a sum of dead letters is not credible; saturating at the
// first term keeps the view up rather than failing it.
fn saturating_add(sum: Amount, amount: Amount) -> Amount {
    sum.checked_add(amount).unwrap_or(sum)
}

impl Sums {
    fn add(&mut self, exposure: &Exposure, verdict: Verdict) {
        let sum = self
            .sums
            .entry((exposure.partner_id, exposure.currency.clone()))
            .or_default();
        sum.letters += 1;
        if !self.rows.insert((exposure.entity, exposure.id)) {
            return;
        }
        sum.rows += 1;
        sum.amount = saturating_add(sum.amount, exposure.amount);
        if verdict == Verdict::NeedsHuman {
            sum.needs_a_human = saturating_add(sum.needs_a_human, exposure.amount);
        }
    }

    fn biggest_first(self) -> Vec<ExposureSum> {
        let mut sums: Vec<ExposureSum> = self
            .sums
            .into_iter()
            .map(|((partner_id, currency), sum)| ExposureSum {
                partner_id,
                currency,
                amount: sum.amount,
                needs_a_human: sum.needs_a_human,
                rows: sum.rows,
                letters: sum.letters,
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
pub async fn overview(pool: &MySqlPool, triager: &Triager) -> Result<Overview, DeadLetterError> {
    let mut conn = pool.acquire().await?;
    let rows = group_rows(&mut conn).await?;
    let total: i64 = rows.iter().map(|row| row.2).sum();

    let mut by_group: BTreeMap<(String, String), Sums> = BTreeMap::new();
    let mut all = Sums::default();
    let mut triaged: HashMap<TriageKey, Triage> = HashMap::new();
    let mut after_id = 0;
    let mut scanned = 0;
    while scanned < EXPOSURE_SCAN_LIMIT {
        let page = letter::new_after(
            &mut conn,
            after_id,
            SCAN_PAGE.min(EXPOSURE_SCAN_LIMIT - scanned),
        )
        .await?;
        let Some((last, _)) = page.last() else {
            break;
        };
        after_id = last.id;
        scanned += u32::try_from(page.len()).unwrap_or(u32::MAX);
        let mut keyed = Vec::with_capacity(page.len());
        let mut to_triage = Vec::new();
        let mut to_triage_keys = Vec::new();
        let mut queued = HashSet::new();
        for (letter, body) in page {
            let key = TriageKey::of(&letter, &body);
            if !triaged.contains_key(&key) && queued.insert(key.clone()) {
                to_triage.push((letter.clone(), body));
                to_triage_keys.push(key.clone());
            }
            keyed.push((letter, key));
        }
        let results = triager.triage_each(pool, to_triage).await?;
        for (key, (_, triage)) in to_triage_keys.into_iter().zip(results) {
            triaged.insert(key, triage);
        }
        for (letter, key) in keyed {
            let Some(triage) = triaged.get(&key) else {
                continue;
            };
            let Some(exposure) = &triage.exposure else {
                continue;
            };
            if triage.verdict == Verdict::AlreadyApplied {
                continue;
            }
            all.add(exposure, triage.verdict);
            by_group
                .entry((letter.function_name, letter.reason))
                .or_default()
                .add(exposure, triage.verdict);
        }
    }

    let mut groups: Vec<Group> = rows
        .into_iter()
        .map(|(function, reason, count, failures, first, last)| {
            let exposure = by_group
                .remove(&(function.clone(), reason.clone()))
                .unwrap_or_default()
                .biggest_first();
            Group {
                function,
                reason,
                count: u64::try_from(count).unwrap_or(0),
                failures: u64::try_from(failures).unwrap_or(0),
                first_failed_at: first,
                last_failed_at: last,
                exposure,
            }
        })
        .collect();
    // Amounts in different currencies do not compare as money; the biggest single sum is
    // what an operator looks for first, and letters without money come after, most failures
    // first.
    groups.sort_by(|a, b| {
        let biggest = |g: &Group| g.exposure.first().map(|sum| sum.amount);
        biggest(b)
            .cmp(&biggest(a))
            .then_with(|| b.failures.cmp(&a.failures))
            .then_with(|| (&a.function, &a.reason).cmp(&(&b.function, &b.reason)))
    });
    Ok(Overview {
        groups,
        exposure: all.biggest_first(),
        exposure_complete: total <= i64::from(EXPOSURE_SCAN_LIMIT),
    })
}
