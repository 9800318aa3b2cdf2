//! What each function did per minute, kept in the database so that the console can draw it
//! wherever the functions run (one process, many, or Lambdas in several environments) without
//! a Prometheus.
//!
//! Every outcome a process records (`metrics::record`) is also tallied here in memory, per
//! function and minute, as `done`, `skipped`, `retried` or `failed`; the tally is added to the
//! `function_activity` rows by one statement every [`FLUSH_EVERY`] (a running process, the
//! `paybus_maintenance::ActivityFlush` job), after each invocation (a Lambda)
//! and when a process stops. Nothing is written on the messages' own transactions, so the
//! money path pays one uncontended lock a message. A process killed between flushes loses at
//! most that interval's counts: the charts are for people, the rows of the workflows are the
//! record.
//!
//! Outcomes that are none of the four (`deferred`, `parked`, `refused`) are not tallied; the
//! dead-letter recorder adds each new failure ([`count_dead_letter`]) for the dead-letter chart.

use std::{
    collections::BTreeMap,
    sync::{Mutex, OnceLock},
    time::Duration,
};

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlPool, QueryBuilder};

/// How often a running process adds its tally to the database.
pub const FLUSH_EVERY: Duration = Duration::from_secs(10);

/// What an outcome counts as on the charts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    Done,
    Skipped,
    /// Retried later (`retry`, `requeued`, a job's `…_retry`).
    Retried,
    /// Failed for good (`failed`, `dead_lettered`, `malformed`, a job's `…_failed`).
    Failed,
}

impl Counted {
    /// The column an outcome label adds to, if any. Jobs label their outcomes with a prefix
    /// (`task_done`, `worker_failed`): the part after the last `_` that names one of the four
    /// decides.
    pub fn of(outcome: &str) -> Option<Self> {
        let last = outcome.rsplit('_').next().unwrap_or(outcome);
        match (outcome, last) {
            (_, "done") => Some(Self::Done),
            (_, "skipped") => Some(Self::Skipped),
            (_, "retry" | "requeued") => Some(Self::Retried),
            ("dead_lettered", _) | (_, "failed" | "malformed") => Some(Self::Failed),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Done => 0,
            Self::Skipped => 1,
            Self::Retried => 2,
            Self::Failed => 3,
        }
    }
}

/// Counts of one function in one minute: done, skipped, retried, failed, dead letters.
type Counts = [u64; 5];
const DEAD_LETTERS: usize = 4;
type Tally = BTreeMap<(String, i64), Counts>;

fn tally() -> &'static Mutex<Tally> {
    static TALLY: OnceLock<Mutex<Tally>> = OnceLock::new();
    TALLY.get_or_init(Default::default)
}

/// Tallies one outcome of `function` in the current minute.
pub fn count(function: &str, outcome: &str) {
    if let Some(counted) = Counted::of(outcome) {
        add(function, counted.index());
    }
}

/// Tallies one dead-letter failure of `function` recorded in the current minute (counted in
/// the recording transaction: a recording rolled back by its caller would still be counted,
/// which no recorder path does but on a database error).
pub fn count_dead_letter(function: &str) {
    add(function, DEAD_LETTERS);
}

fn add(function: &str, column: usize) {
    let minute = Utc::now().timestamp().div_euclid(60);
    let mut tally = tally().lock().unwrap_or_else(|p| p.into_inner());
    let counts = match tally.get_mut(&(function.to_owned(), minute)) {
        Some(counts) => counts,
        None => tally.entry((function.to_owned(), minute)).or_default(),
    };
    counts[column] += 1;
}

/// Adds this process's tally to `function_activity` in one statement, and forgets it. If the
/// statement fails the counts are put back for the next flush.
pub async fn flush(pool: &MySqlPool) -> Result<u64, sqlx::Error> {
    let taken = std::mem::take(&mut *tally().lock().unwrap_or_else(|p| p.into_inner()));
    if taken.is_empty() {
        return Ok(0);
    }
    let mut insert = QueryBuilder::<MySql>::new(
        "INSERT INTO function_activity \
         (function_name, minute_at, done, skipped, retried, failed, dead_letters) ",
    );
    insert.push_values(&taken, |mut row, ((function, minute), counts)| {
        let at = DateTime::<Utc>::from_timestamp(minute * 60, 0).unwrap_or_default();
        row.push_bind(function.as_str())
            .push_bind(at.naive_utc())
            .push_bind(counts[0])
            .push_bind(counts[1])
            .push_bind(counts[2])
            .push_bind(counts[3])
            .push_bind(counts[DEAD_LETTERS]);
    });
    // VALUES() is what MariaDB and MySQL 8 both read here (MySQL's row alias is not MariaDB's).
    insert.push(
        " ON DUPLICATE KEY UPDATE done = done + VALUES(done), \
         skipped = skipped + VALUES(skipped), retried = retried + VALUES(retried), \
         failed = failed + VALUES(failed), dead_letters = dead_letters + VALUES(dead_letters)",
    );
    match insert.build().execute(pool).await {
        Ok(_) => Ok(taken.values().map(|c| c.iter().sum::<u64>()).sum()),
        Err(error) => {
            let mut tally = tally().lock().unwrap_or_else(|p| p.into_inner());
            for (key, counts) in taken {
                let kept = tally.entry(key).or_default();
                for (kept, more) in kept.iter_mut().zip(counts) {
                    *kept += more;
                }
            }
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Counted;

    #[test]
    fn every_label_the_runtime_and_the_jobs_record_counts_where_the_charts_say() {
        for (label, counted) in [
            ("done", Some(Counted::Done)),
            ("task_done", Some(Counted::Done)),
            ("worker_done", Some(Counted::Done)),
            ("due_order_done", Some(Counted::Done)),
            ("due_order_failed", Some(Counted::Failed)),
            ("skipped", Some(Counted::Skipped)),
            ("task_skipped", Some(Counted::Skipped)),
            ("retry", Some(Counted::Retried)),
            ("requeued", Some(Counted::Retried)),
            ("worker_retry", Some(Counted::Retried)),
            ("failed", Some(Counted::Failed)),
            ("dead_lettered", Some(Counted::Failed)),
            ("malformed", Some(Counted::Failed)),
            ("task_failed", Some(Counted::Failed)),
            ("deferred", None),
            ("parked", None),
            ("refused", None),
            ("worker_claim_lost", None),
            ("task_not_claimed", None),
        ] {
            assert_eq!(Counted::of(label), counted, "{label}");
        }
    }
}
