//! The audit framework: invariants that plain SQL can check, contributed by each workflow's
//! domain crate (the ledger's balances and chains, W2's one DEBIT per confirmed withdrawal,
//! ...) and run together by `paybus audit`, the admin API and the tests.
//!
//! A domain writes its checks with its own typed violation enum (a [`Finding`]) and exposes
//! them as [`Check`]s; [`run`] runs a list of checks in the caller's transaction (open one so
//! every check sees the same snapshot) and returns uniform [`Violation`]s.
//!
//! A check may also offer a `recent` form over the rows written since an instant
//! ([`Window`]): the continuous auditor (`paybus_maintenance::auditor`) runs that one every minute, so a
//! pass costs what was written lately, not the whole table; `paybus audit` still runs the
//! full form.

use std::{fmt, future::Future, pin::Pin};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlConnection;

/// A domain's typed violation: it names its check, renders as one line naming the ids
/// involved, and serialises its fields (as a serde-tagged enum: the tag is dropped here).
pub trait Finding: Serialize + fmt::Display {
    /// The stable name of the check that found it (for grouping, the API and metrics).
    fn check(&self) -> &'static str;
}

/// One broken invariant, whichever check found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub check: &'static str,
    /// One line naming the ids involved, starting with the check's name.
    pub description: String,
    /// The ids and values involved, as the finding serialises them.
    #[serde(flatten)]
    pub detail: serde_json::Map<String, serde_json::Value>,
}

impl<F: Finding> From<F> for Violation {
    fn from(finding: F) -> Self {
        let mut detail = match serde_json::to_value(&finding) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        detail.remove("check");
        Violation {
            check: finding.check(),
            description: finding.to_string(),
            detail,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

pub type CheckFuture<'c> =
    Pin<Box<dyn Future<Output = Result<Vec<Violation>, sqlx::Error>> + Send + 'c>>;

/// The rows a windowed check looks at: those written since `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since: DateTime<Utc>,
}

/// Which rows a check reads: all of them (`paybus audit`), or those a [`Window`] touched (the
/// continuous auditor). A domain writes each check's SQL once, with a `{recent}` marker where
/// the window narrows it, and runs it with [`Scope::fetch`].
///
/// A `recent` fragment names the index of the time column it reads (`FORCE INDEX`): on young
/// tables, where a window is a tenth of a table, MariaDB chooses whole-table scans or
/// another index otherwise (an `IS NOT NULL` on the idem-key index estimated at a fifth of its
/// rows), and a pass then grows with the tables rather than with its span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    All,
    Recent(Window),
}

/// The marker [`Scope::fetch`] replaces.
pub const RECENT: &str = "{recent}";

impl Scope {
    /// Runs `sql` with its `{recent}` marker replaced: by nothing for [`Scope::All`], by
    /// `recent` for [`Scope::Recent`] — a fragment (a JOIN onto the ids the window touched,
    /// read through an index on their time column, or an extra condition) in which every `?`
    /// is the window's start. `sql` itself takes no parameters.
    pub async fn fetch<T>(
        self,
        conn: &mut MySqlConnection,
        sql: &str,
        recent: &str,
    ) -> Result<Vec<T>, sqlx::Error>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow> + Send + Unpin,
    {
        debug_assert!(sql.contains(RECENT), "no {RECENT} marker in {sql}");
        let (sql, since) = match self {
            Scope::All => (sql.replace(RECENT, ""), None),
            Scope::Recent(window) => (sql.replace(RECENT, recent), Some(window.since)),
        };
        let mut query = sqlx::query_as::<_, T>(sqlx::AssertSqlSafe(sql));
        if let Some(since) = since {
            for _ in 0..recent.matches('?').count() {
                query = query.bind(since);
            }
        }
        query.fetch_all(conn).await
    }
}

/// A check over the rows of a [`Window`].
pub type RecentFn = for<'c> fn(&'c mut MySqlConnection, Window) -> CheckFuture<'c>;

/// One invariant check, as a domain crate contributes it.
#[derive(Clone, Copy)]
pub struct Check {
    pub name: &'static str,
    pub run: for<'c> fn(&'c mut MySqlConnection) -> CheckFuture<'c>,
    /// The same invariant over recent rows only (indexed), when the domain offers one; the
    /// continuous auditor runs the full `run` otherwise.
    pub recent: Option<RecentFn>,
}

/// A [`Check`] from a domain's typed check functions, without the boxing every registration
/// would repeat:
/// - `audit_check!("name", full, recent: windowed)`: `full(conn)` for `paybus audit`,
///   `windowed(conn, window)` for the continuous auditor;
/// - `audit_check!("name", full, bounded)`: the same read every pass (it reads a live set —
///   reservations in flight, say — whose size does not grow with the table);
/// - `audit_check!("name", full)`: no windowed form; the auditor runs the full one.
///
/// Each function returns `Result<Vec<F>, sqlx::Error>` for a [`Finding`] type `F`.
#[macro_export]
macro_rules! audit_check {
    ($name:literal, $full:path, recent: $recent:path) => {
        $crate::audit::Check {
            name: $name,
            run: |conn| Box::pin(async move { Ok($crate::audit::violations($full(conn).await?)) }),
            recent: Some(|conn, window| {
                Box::pin(async move { Ok($crate::audit::violations($recent(conn, window).await?)) })
            }),
        }
    };
    ($name:literal, $full:path, bounded) => {
        $crate::audit::Check {
            name: $name,
            run: |conn| Box::pin(async move { Ok($crate::audit::violations($full(conn).await?)) }),
            recent: Some(|conn, _| {
                Box::pin(async move { Ok($crate::audit::violations($full(conn).await?)) })
            }),
        }
    };
    ($name:literal, $full:path) => {
        $crate::audit::Check {
            name: $name,
            run: |conn| Box::pin(async move { Ok($crate::audit::violations($full(conn).await?)) }),
            recent: None,
        }
    };
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

/// The span an [`ExternalCheck`] compares: what happened in `[since, until)`, `until` being the
/// instant of the caller's snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// An invariant between paybus's rows and a counterparty's own record of the same effects
/// (W1: the fills paybus settled against the trades the quote service made). It needs a
/// client, so it is an object built at start-up (a function contributes it), not a `fn`;
/// the continuous auditor runs it in the same pass and snapshot as the SQL checks, over its
/// window, and its findings go where theirs go.
pub trait ExternalCheck: Send + Sync {
    fn name(&self) -> &'static str;

    /// The violations among the effects of `period`, read in `conn`'s snapshot. A
    /// counterparty that cannot be reached is not a violation: the check logs it and finds
    /// nothing (the next pass looks again).
    fn run<'c>(&'c self, conn: &'c mut MySqlConnection, period: Period) -> CheckFuture<'c>;
}

/// Typed findings as violations (for a check's `run`).
pub fn violations<F: Finding>(findings: Vec<F>) -> Vec<Violation> {
    findings.into_iter().map(Violation::from).collect()
}

/// Runs every check in order on `conn` and returns what they found; empty means clean.
#[tracing::instrument(skip_all, fields(checks = checks.len()))]
pub async fn run(
    conn: &mut MySqlConnection,
    checks: &[Check],
) -> Result<Vec<Violation>, sqlx::Error> {
    let mut found = Vec::new();
    for check in checks {
        found.extend((check.run)(conn).await?);
    }
    if found.is_empty() {
        tracing::info!("audit clean");
    } else {
        tracing::warn!(violations = found.len(), "audit found violations");
    }
    Ok(found)
}

/// Runs every check over `window` (its `recent` form, else its full one) on `conn`.
pub async fn run_recent(
    conn: &mut MySqlConnection,
    checks: &[Check],
    window: Window,
) -> Result<Vec<Violation>, sqlx::Error> {
    let mut found = Vec::new();
    for check in checks {
        found.extend(match check.recent {
            Some(recent) => recent(conn, window).await?,
            None => (check.run)(conn).await?,
        });
    }
    Ok(found)
}
