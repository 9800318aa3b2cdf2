//! The continuous auditor: a sweeper job that runs every workflow's invariants (the catalog's
//! checks) over recent rows, every minute by default.
//!
//! A pass opens one read-only transaction (one snapshot for every check) and runs each check's
//! `recent` form over the rows written since the previous pass began, less an overlap (default
//! 2 min, so a transaction that committed after that pass's snapshot is read by this one), at
//! most `window` back (default 15 min). Each violation is an ERROR line, a metric
//! (`paybus_audit_violations_total{check}`) and an `audit_findings` row; each pass is an
//! `audit_passes` row (`GET /v1/admin/audit/status`), pruned after `retention`.
//!
//! Why the span since the last pass and not the whole window every pass: the window would read
//! each row window ÷ interval = 15 times; such passes take up to 16 s a minute on a 2-core
//! machine at ~105 items/s, and the soak's p99 drifts with them. Rows older than the window are
//! for `paybus audit`, the full checks on demand (nightly). docs/operations.md ("The continuous
//! auditor") has the rest.

use std::{collections::HashMap, sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlPool;

use crate::{Job, JobFuture, JobReport};
use paybus_bus::metrics;
use paybus_config::{ConfigError, Vars, setting::Setting};
use paybus_db as db;
use paybus_ops::audit::{self, Check, ExternalCheck, Period, Violation, Window};

pub const VAR_INTERVAL_MS: Setting = Setting {
    name: "PAYBUS_AUDITOR_INTERVAL_MS",
    default: "`60000`",
    about: "the continuous auditor: pause between passes (milliseconds, at least 1)",
};
pub const VAR_WINDOW_SECS: Setting = Setting {
    name: "PAYBUS_AUDITOR_WINDOW_SECS",
    default: "`900`",
    about: "the continuous auditor: the furthest back a pass reads (the first pass, and the \
            first after an outage; older rows are the full `paybus audit`'s) (seconds, at least 1)",
};
pub const VAR_OVERLAP_SECS: Setting = Setting {
    name: "PAYBUS_AUDITOR_OVERLAP_SECS",
    default: "`120`",
    about: "the continuous auditor: a pass reads from the previous pass's start less this (longer \
            than paybus's longest transaction, so a late commit is read by the next pass) (seconds, at least 1)",
};
pub const VAR_RETENTION_HOURS: Setting = Setting {
    name: "PAYBUS_AUDITOR_RETENTION_HOURS",
    default: "`168`",
    about: "the continuous auditor: passes kept in `audit_passes` (hours, at least 1)",
};

/// The ERROR line of each violation (with `check` and `description`): what the AWS deployment
/// alarms on (a metric filter on the sweeper's log) and rolls a deploy back on.
pub const VIOLATION_LINE: &str = "audit violation";

/// What [`AuditorConfig::read`] reads, in the order the page lists them.
pub const SETTINGS: &[Setting] = &[
    VAR_INTERVAL_MS,
    VAR_WINDOW_SECS,
    VAR_OVERLAP_SECS,
    VAR_RETENTION_HOURS,
];

/// How the auditor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditorConfig {
    /// Pause between passes (default 60 s, `PAYBUS_AUDITOR_INTERVAL_MS`).
    pub interval: Duration,
    /// The furthest back a pass reads (default 15 min, `PAYBUS_AUDITOR_WINDOW_SECS`): the
    /// first pass on a database, and the first after the auditor stood still longer than
    /// this (the gap is logged as a WARN; the full audit covers it).
    pub window: Duration,
    /// A pass reads the rows written since the previous pass began less this (default 2 min,
    /// `PAYBUS_AUDITOR_OVERLAP_SECS`). A row is stamped when written and seen when its
    /// transaction commits: a commit later than the previous pass's snapshot is read by this
    /// one as long as its transaction lasted less than the overlap. paybus's transactions
    /// last milliseconds (the longest waits on a lock, `innodb_lock_wait_timeout`, 50 s);
    /// no network call is made inside one.
    pub overlap: Duration,
    /// Passes kept in `audit_passes` (default 7 days, `PAYBUS_AUDITOR_RETENTION_HOURS`).
    pub retention: Duration,
}

impl Default for AuditorConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            window: Duration::from_secs(15 * 60),
            overlap: Duration::from_secs(2 * 60),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl AuditorConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Vars::from_env())
    }

    pub fn from_vars(vars: HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::read(&Vars::new(vars))
    }

    /// The defaults, overridden by the variables that are set; a malformed value names the
    /// variable.
    pub fn read(vars: &Vars) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        let positive = |value: &u64| *value > 0;
        Ok(Self {
            interval: Duration::from_millis(vars.parse(
                VAR_INTERVAL_MS,
                defaults.interval.as_millis() as u64,
                "milliseconds, at least 1",
                positive,
            )?),
            window: Duration::from_secs(vars.parse(
                VAR_WINDOW_SECS,
                defaults.window.as_secs(),
                "seconds, at least 1",
                positive,
            )?),
            overlap: Duration::from_secs(vars.parse(
                VAR_OVERLAP_SECS,
                defaults.overlap.as_secs(),
                "seconds, at least 1",
                positive,
            )?),
            retention: Duration::from_secs(
                vars.parse(
                    VAR_RETENTION_HOURS,
                    defaults.retention.as_secs() / 3600,
                    "hours, at least 1",
                    positive,
                )? * 3600,
            ),
        })
    }

    /// How far back a pass reads once passes follow each other: the interval plus the
    /// overlap, at most the window. The auditor's cost follows it (the write rate times it).
    pub fn steady_span(&self) -> Duration {
        (self.interval + self.overlap).min(self.window)
    }

    /// Where a pass starting at `now` begins reading: the previous pass's start less the
    /// overlap, at most the window back. A gap longer than the window is said, here.
    pub fn pass_since(&self, now: DateTime<Utc>, previous: Option<DateTime<Utc>>) -> DateTime<Utc> {
        let furthest = before(now, self.window);
        let Some(previous) = previous else {
            return furthest;
        };
        if previous < furthest {
            tracing::warn!(
                previous_pass = %previous, covered_from = %furthest,
                "the continuous auditor stood still longer than its window: rows written \
                 between previous_pass and covered_from are left to the full audit \
                 (paybus audit)"
            );
        }
        before(previous, self.overlap).max(furthest)
    }
}

/// What one pass found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pass {
    pub id: u64,
    pub window_since: DateTime<Utc>,
    pub checks: u32,
    pub violations: Vec<Violation>,
    pub duration: Duration,
}

/// The auditor job.
#[derive(Clone)]
pub struct Auditor {
    pool: MySqlPool,
    checks: Arc<[Check]>,
    external: Arc<[Arc<dyn ExternalCheck>]>,
    config: AuditorConfig,
}

impl Auditor {
    pub fn new(pool: MySqlPool, checks: Vec<Check>, config: AuditorConfig) -> Self {
        Self {
            pool,
            checks: checks.into(),
            external: Arc::new([]),
            config,
        }
    }

    /// The same auditor, also comparing paybus with counterparties' records every pass.
    pub fn with_external(mut self, checks: Vec<Arc<dyn ExternalCheck>>) -> Self {
        self.external = checks.into();
        self
    }

    /// One pass over the window ending now (the database's clock).
    #[tracing::instrument(skip_all, fields(checks = self.checks.len(), external = self.external.len()))]
    pub async fn pass(&self) -> Result<Pass, sqlx::Error> {
        let started = std::time::Instant::now();
        // One snapshot for every check: some compare rows two statements read.
        let mut tx = db::begin_snapshot(&self.pool).await?;
        // The snapshot's instant and the previous pass's (any process's): the first
        // statement of the transaction, so both are read in the snapshot the checks use.
        let (started_at, previous): (DateTime<Utc>, Option<DateTime<Utc>>) =
            sqlx::query_as("SELECT NOW(6), (SELECT MAX(started_at) FROM audit_passes)")
                .fetch_one(&mut *tx)
                .await?;
        let since = self.config.pass_since(started_at, previous);
        let mut violations = audit::run_recent(&mut tx, &self.checks, Window { since }).await?;
        for check in self.external.iter() {
            let period = Period {
                since,
                until: started_at,
            };
            violations.extend(check.run(&mut tx, period).await?);
        }
        tx.rollback().await?;
        let duration = started.elapsed();

        let checks = u32::try_from(self.checks.len() + self.external.len()).unwrap_or(u32::MAX);
        let mut tx = self.pool.begin().await?;
        let id = sqlx::query(
            "INSERT INTO audit_passes \
             (started_at, finished_at, window_since, checks, violations, duration_ms) \
             VALUES (?, NOW(6), ?, ?, ?, ?)",
        )
        .bind(started_at)
        .bind(since)
        .bind(checks)
        .bind(u32::try_from(violations.len()).unwrap_or(u32::MAX))
        .bind(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
        .execute(&mut *tx)
        .await?
        .last_insert_id();
        for violation in &violations {
            record_finding(&mut tx, id, violation).await?;
        }
        tx.commit().await?;

        for violation in &violations {
            tracing::error!(
                check = violation.check, description = %violation.description, pass = id,
                "{VIOLATION_LINE}"
            );
        }
        metrics::record_audit_pass(&violations, duration);
        let retention = i64::try_from(self.config.retention.as_micros()).unwrap_or(i64::MAX);
        sqlx::query("DELETE FROM audit_passes WHERE started_at < NOW(6) - INTERVAL ? MICROSECOND")
            .bind(retention)
            .execute(&self.pool)
            .await?;
        Ok(Pass {
            id,
            window_since: since,
            checks,
            violations,
            duration,
        })
    }
}

/// `duration` before `instant`; an absurd setting (centuries) reads from 1970, which every
/// row is after.
fn before(instant: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(duration)
        .ok()
        .and_then(|duration| instant.checked_sub_signed(duration))
        .map_or(DateTime::UNIX_EPOCH, |since| {
            since.max(DateTime::UNIX_EPOCH)
        })
}

async fn record_finding(
    conn: &mut sqlx::MySqlConnection,
    pass_id: u64,
    violation: &Violation,
) -> Result<(), sqlx::Error> {
    use sha2::{Digest, Sha256};
    let fingerprint = hex::encode(Sha256::digest(
        format!("{}\n{}", violation.check, violation.description).as_bytes(),
    ));
    let detail = serde_json::Value::Object(violation.detail.clone()).to_string();
    sqlx::query(
        "INSERT INTO audit_findings \
         (fingerprint, check_name, description, detail, last_pass_id) VALUES (?, ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE last_seen_at = NOW(6), times_seen = times_seen + 1, \
                                 detail = VALUES(detail), last_pass_id = VALUES(last_pass_id)",
    )
    .bind(fingerprint)
    .bind(violation.check)
    .bind(violation.description.chars().take(2000).collect::<String>())
    .bind(detail)
    .bind(pass_id)
    .execute(conn)
    .await?;
    Ok(())
}

impl Job for Auditor {
    fn name(&self) -> &'static str {
        "auditor"
    }

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            let pass = self.pass().await?;
            Ok(JobReport {
                changed: pass.violations.len() as u64,
            })
        })
    }
}

/// A pass as recorded in `audit_passes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct PassRecord {
    pub id: u64,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub window_since: Option<DateTime<Utc>>,
    pub checks: u32,
    pub violations: u32,
    pub duration_ms: u64,
}

/// A violation as recorded in `audit_findings`.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Finding {
    pub id: u64,
    pub check_name: String,
    pub description: String,
    #[sqlx(json)]
    pub detail: serde_json::Value,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub times_seen: u32,
    pub last_pass_id: u64,
}

/// The latest passes, newest first.
pub async fn recent_passes(
    conn: &mut sqlx::MySqlConnection,
    limit: u32,
) -> Result<Vec<PassRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, started_at, finished_at, window_since, checks, violations, duration_ms \
         FROM audit_passes ORDER BY id DESC LIMIT ?",
    )
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Findings, most recently seen first; `only_pass`: only those the given pass saw.
pub async fn findings(
    conn: &mut sqlx::MySqlConnection,
    only_pass: Option<u64>,
    limit: u32,
) -> Result<Vec<Finding>, sqlx::Error> {
    let select = "SELECT id, check_name, description, detail, first_seen_at, last_seen_at, \
                  times_seen, last_pass_id FROM audit_findings";
    let query = match only_pass {
        Some(pass) => sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "{select} WHERE last_pass_id = ? ORDER BY id LIMIT ?"
        )))
        .bind(pass),
        None => sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "{select} ORDER BY last_seen_at DESC, id DESC LIMIT ?"
        ))),
    };
    query.bind(limit).fetch_all(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::Duration::days(20_000) + chrono::Duration::minutes(minute)
    }

    #[test]
    fn a_pass_reads_from_the_previous_pass_less_the_overlap() {
        let config = AuditorConfig::default();
        assert_eq!(config.pass_since(at(60), Some(at(59))), at(57));
        assert_eq!(config.steady_span(), Duration::from_secs(3 * 60));
    }

    #[test]
    fn the_first_pass_and_one_after_an_outage_read_at_most_the_window() {
        let config = AuditorConfig::default();
        assert_eq!(config.pass_since(at(60), None), at(45));
        assert_eq!(config.pass_since(at(60), Some(at(10))), at(45));
        // An overlap longer than the window is cut to it (a test's 15-s window).
        let short = AuditorConfig {
            window: Duration::from_secs(15),
            ..AuditorConfig::default()
        };
        assert_eq!(
            short.pass_since(at(60), Some(at(60))),
            at(60) - chrono::Duration::seconds(15)
        );
        assert_eq!(short.steady_span(), Duration::from_secs(15));
    }

    #[test]
    fn an_absurd_window_reads_from_1970() {
        let config = AuditorConfig {
            window: Duration::from_secs(u64::MAX / 4),
            ..AuditorConfig::default()
        };
        assert_eq!(config.pass_since(at(60), None), DateTime::UNIX_EPOCH);
    }

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                AuditorConfig::from_vars(environment),
                Ok(AuditorConfig::default()),
                "{name}"
            );
        }
    }
}
