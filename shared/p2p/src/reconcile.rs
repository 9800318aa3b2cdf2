//! Reconciliation with the quote service: the trades it made against the fills paybus settled,
//! both ways (principle 12). Run by the continuous auditor as an [`ExternalCheck`] (at most every
//! [`RECONCILE_EVERY`], its findings repeated by the passes between, so the status does not
//! flicker) and by `paybus reconcile quotes [--since]`.
//!
//! | finding | what it means |
//! | --- | --- |
//! | `p2p_orphan_trade` | the quote service made a trade under a paybus key that has no settled fill and no fill in doubt: money moved at the counterparty without a trace in paybus |
//! | `p2p_missing_trade` | a fill paybus settled (CONFIRMED) whose trade the quote service does not have |
//! | `p2p_trade_mismatch` | both have it, but not the same (another trade id, another amount) |
//!
//! Fills in doubt are listed apart: known and being resolved, not violations. One snapshot
//! suffices because a fill is marked TRADING, committed, *before* its createTrade is sent; only
//! trades older than the period's end minus [`CLOCK_SKEW`] are judged, so the service's clock may
//! run a little ahead.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt,
    sync::Mutex,
    time::Duration,
};

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use paybus_db as db;
use paybus_money::Amount;
use paybus_ops::audit::{self, CheckFuture, ExternalCheck, Finding as _, Period};
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySqlConnection};

use crate::quote::{QuoteClient, QuoteError, TradeRecord};

/// How far the quote service's clock may run ahead of the database's.
pub const CLOCK_SKEW: Duration = Duration::from_secs(30);
/// Trades are listed from this long before the period, so a fill settled in the period whose
/// trade was made just before it is found in the listing rather than asked for one by one.
const LOOKBACK: Duration = Duration::from_secs(10 * 60);
/// How often the auditor's reconciliation asks the quote service for its window's trades (the
/// auditor passes every minute; listing 15 minutes of trades each time is the quote service's
/// cost, not paybus's).
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5 * 60);
/// Keys per `IN (...)` read.
const CHUNK: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Quote(#[from] QuoteError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// A broken agreement between paybus and the quote service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum Discrepancy {
    /// A trade with no settled fill and no fill in doubt in paybus.
    OrphanTrade {
        trade_id: String,
        trade_key: String,
        amount: Amount,
        currency: String,
        created_at: DateTime<Utc>,
        /// What paybus has under the key: `no match`, `RELEASED`, `RESERVED`.
        in_paybus: String,
    },
    /// A CONFIRMED fill whose trade the service does not have.
    MissingTrade {
        trade_key: String,
        trade_id: String,
        deposit_order_id: u64,
        amount: Amount,
        confirmed_at: DateTime<Utc>,
    },
    /// A settled fill and the service's trade under the same key disagree.
    TradeMismatch {
        trade_key: String,
        deposit_order_id: u64,
        paybus_trade_id: String,
        paybus_amount: Amount,
        service_trade_id: String,
        service_amount: Amount,
    },
}

impl audit::Finding for Discrepancy {
    fn check(&self) -> &'static str {
        match self {
            Discrepancy::OrphanTrade { .. } => "p2p_orphan_trade",
            Discrepancy::MissingTrade { .. } => "p2p_missing_trade",
            Discrepancy::TradeMismatch { .. } => "p2p_trade_mismatch",
        }
    }
}

impl fmt::Display for Discrepancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.check())?;
        match self {
            Discrepancy::OrphanTrade {
                trade_id,
                trade_key,
                amount,
                currency,
                in_paybus,
                ..
            } => write!(
                f,
                "the quote service has trade {trade_id} for {amount} {currency} under key \
                 {trade_key}, which paybus never settled ({in_paybus})"
            ),
            Discrepancy::MissingTrade {
                trade_key,
                trade_id,
                deposit_order_id,
                amount,
                ..
            } => write!(
                f,
                "paybus settled fill {trade_key} of deposit order {deposit_order_id} ({amount}) \
                 as trade {trade_id}, which the quote service does not have"
            ),
            Discrepancy::TradeMismatch {
                trade_key,
                deposit_order_id,
                paybus_trade_id,
                paybus_amount,
                service_trade_id,
                service_amount,
            } => write!(
                f,
                "fill {trade_key} of deposit order {deposit_order_id}: paybus settled trade \
                 {paybus_trade_id} for {paybus_amount}, the quote service has trade \
                 {service_trade_id} for {service_amount}"
            ),
        }
    }
}

/// A fill whose createTrade outcome is unknown, as reconciliation sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FillInDoubt {
    pub trade_key: String,
    pub deposit_order_id: u64,
    pub order_status: String,
    pub amount: Amount,
    pub sent_at: DateTime<Utc>,
    pub checks: u32,
    /// The service's trade under the key, when it has one (the next check settles it).
    pub service_trade_id: Option<String>,
}

/// What one reconciliation found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reconciliation {
    /// The service's trades judged were created in `[since, judged_until)`.
    pub since: DateTime<Utc>,
    pub judged_until: DateTime<Utc>,
    pub trades_listed: usize,
    pub fills_settled: usize,
    pub discrepancies: Vec<Discrepancy>,
    pub in_doubt: Vec<FillInDoubt>,
}

impl Reconciliation {
    pub fn is_clean(&self) -> bool {
        self.discrepancies.is_empty()
    }
}

#[derive(sqlx::FromRow)]
struct FillRow {
    trade_key: String,
    status: String,
    amount: Amount,
    trade_id: Option<String>,
    deposit_order_id: u64,
    confirmed_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct SettledRow {
    trade_key: String,
    trade_id: String,
    amount: Amount,
    deposit_order_id: u64,
    confirmed_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct DoubtRow {
    trade_key: String,
    deposit_order_id: u64,
    order_status: String,
    amount: Amount,
    sent_at: DateTime<Utc>,
    checks: u32,
}

/// Compares the quote service's trades created in `[since, until − CLOCK_SKEW)` with paybus's
/// fills read in `conn` (one snapshot: open a transaction), and the fills settled in
/// `[since, until)` with the service's trades.
///
/// The listing is judged a page at a time and the settled fills are streamed, so a pass holds
/// one page of trades whatever the window's volume (the sweeper's memory grew with it); what
/// crosses pages is only the keys the settled side and the fills in doubt need.
pub async fn reconcile(
    conn: &mut MySqlConnection,
    client: &QuoteClient,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Reconciliation, ReconcileError> {
    let judged_until = until - skew();
    let listed_since = since - chrono::Duration::from_std(LOOKBACK).unwrap_or_default();
    let mut listing = Listing::new(since, until);
    if judged_until > listed_since {
        let mut pages = client.trades_created(listed_since, judged_until);
        while let Some(page) = pages.next_page().await? {
            let fills = fills_by_key(conn, page.iter().map(|t| t.idempotency_key.as_str())).await?;
            for trade in &page {
                listing.judge(trade, fills.get(trade.idempotency_key.as_str()));
            }
        }
    }
    let Listing {
        trades_listed,
        mut discrepancies,
        settled_and_listed,
        doubts_listed,
        ..
    } = listing;

    let mut fills_settled = 0;
    let mut settled = sqlx::query_as::<_, SettledRow>(
        "SELECT trade_key, MIN(external_trade_id) AS trade_id, SUM(amount) AS amount, \
                MIN(deposit_order_id) AS deposit_order_id, MAX(confirmed_at) AS confirmed_at \
         FROM p2p_matches \
         WHERE status = 'CONFIRMED' AND confirmed_at >= ? AND confirmed_at < ? \
         GROUP BY trade_key ORDER BY trade_key",
    )
    .bind(since)
    .bind(until)
    .fetch(&mut *conn);
    while let Some(fill) = settled.try_next().await? {
        fills_settled += 1;
        if settled_and_listed.contains(fill.trade_key.as_str()) {
            continue;
        }
        // Traded outside the listing (before its start: a fill in doubt for long): ask for it.
        match client.trade_by_key(&fill.trade_key).await? {
            None => discrepancies.push(Discrepancy::MissingTrade {
                trade_key: fill.trade_key,
                trade_id: fill.trade_id,
                deposit_order_id: fill.deposit_order_id,
                amount: fill.amount,
                confirmed_at: fill.confirmed_at,
            }),
            Some(trade) if trade.trade_id != fill.trade_id || trade.amount != fill.amount => {
                discrepancies.push(Discrepancy::TradeMismatch {
                    trade_key: fill.trade_key,
                    deposit_order_id: fill.deposit_order_id,
                    paybus_trade_id: fill.trade_id,
                    paybus_amount: fill.amount,
                    service_trade_id: trade.trade_id,
                    service_amount: trade.amount,
                });
            }
            Some(_) => {}
        }
    }
    drop(settled);

    let doubts: Vec<DoubtRow> = sqlx::query_as(
        "SELECT m.trade_key, m.deposit_order_id, d.status AS order_status, \
                SUM(m.amount) AS amount, MIN(m.trade_sent_at) AS sent_at, \
                MAX(m.trade_checks) AS checks \
         FROM p2p_matches m JOIN p2p_deposit_orders d ON d.id = m.deposit_order_id \
         WHERE m.status = 'TRADING' \
         GROUP BY m.trade_key, m.deposit_order_id, d.status ORDER BY m.deposit_order_id",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut in_doubt = Vec::with_capacity(doubts.len());
    for doubt in doubts {
        let service_trade_id = match doubts_listed.get(doubt.trade_key.as_str()) {
            Some(trade_id) => Some(trade_id.clone()),
            None => client
                .trade_by_key(&doubt.trade_key)
                .await?
                .map(|t| t.trade_id),
        };
        in_doubt.push(FillInDoubt {
            trade_key: doubt.trade_key,
            deposit_order_id: doubt.deposit_order_id,
            order_status: doubt.order_status,
            amount: doubt.amount,
            sent_at: doubt.sent_at,
            checks: doubt.checks,
            service_trade_id,
        });
    }

    Ok(Reconciliation {
        since,
        judged_until,
        trades_listed,
        fills_settled,
        discrepancies,
        in_doubt,
    })
}

/// What judging the listing's pages leaves for the rest of a reconciliation.
struct Listing {
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    trades_listed: usize,
    discrepancies: Vec<Discrepancy>,
    /// Keys of fills settled in `[since, until)` whose trade the listing had: judged here.
    settled_and_listed: HashSet<String>,
    /// The listed trade id under each key with a fill in doubt.
    doubts_listed: HashMap<String, String>,
}

impl Listing {
    fn new(since: DateTime<Utc>, until: DateTime<Utc>) -> Self {
        Self {
            since,
            until,
            trades_listed: 0,
            discrepancies: Vec::new(),
            settled_and_listed: HashSet::new(),
            doubts_listed: HashMap::new(),
        }
    }

    /// Judges one listed trade against paybus's fills under its key: from the service's side
    /// when it was created in the period, from paybus's when its fill was settled in it.
    fn judge(&mut self, trade: &TradeRecord, rows: Option<&Vec<FillRow>>) {
        self.trades_listed += 1;
        let of = |status: &str| -> Vec<&FillRow> {
            rows.into_iter()
                .flatten()
                .filter(|r| r.status == status)
                .collect()
        };
        let confirmed = of("CONFIRMED");
        let in_doubt = !of("TRADING").is_empty();
        if in_doubt {
            self.doubts_listed
                .insert(trade.idempotency_key.clone(), trade.trade_id.clone());
        }
        let created_in_period = trade.created_at >= self.since;
        let settled_in_period = confirmed
            .iter()
            .filter_map(|r| r.confirmed_at)
            .max()
            .is_some_and(|at| at >= self.since && at < self.until);
        if settled_in_period {
            self.settled_and_listed
                .insert(trade.idempotency_key.clone());
        }
        if let Some(first) = confirmed.first() {
            let amount = sum(confirmed.iter().map(|r| r.amount));
            let trade_id = first.trade_id.clone().unwrap_or_default();
            let judged = created_in_period || settled_in_period;
            if judged && (trade_id != trade.trade_id || amount != trade.amount) {
                self.discrepancies.push(Discrepancy::TradeMismatch {
                    trade_key: trade.idempotency_key.clone(),
                    deposit_order_id: first.deposit_order_id,
                    paybus_trade_id: trade_id,
                    paybus_amount: amount,
                    service_trade_id: trade.trade_id.clone(),
                    service_amount: trade.amount,
                });
            }
            return;
        }
        if !created_in_period || in_doubt {
            return;
        }
        let in_paybus = rows
            .and_then(|rows| rows.first())
            .map_or_else(|| "no match".to_owned(), |r| r.status.clone());
        self.discrepancies.push(Discrepancy::OrphanTrade {
            trade_id: trade.trade_id.clone(),
            trade_key: trade.idempotency_key.clone(),
            amount: trade.amount,
            currency: trade.currency.clone(),
            created_at: trade.created_at,
            in_paybus,
        });
    }
}

fn skew() -> chrono::Duration {
    chrono::Duration::from_std(CLOCK_SKEW).unwrap_or_default()
}

fn sum(amounts: impl Iterator<Item = Amount>) -> Amount {
    amounts.fold(Amount::ZERO, |total, a| {
        total.checked_add(a).unwrap_or(total)
    })
}

/// paybus's matches under each key, whatever their state.
async fn fills_by_key<'k>(
    conn: &mut MySqlConnection,
    keys: impl Iterator<Item = &'k str>,
) -> Result<BTreeMap<String, Vec<FillRow>>, sqlx::Error> {
    let keys: BTreeSet<&str> = keys.collect();
    let keys: Vec<&str> = keys.into_iter().collect();
    let mut fills: BTreeMap<String, Vec<FillRow>> = BTreeMap::new();
    for chunk in keys.chunks(CHUNK) {
        let rows: Vec<FillRow> = chunk
            .iter()
            .fold(
                sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT trade_key, status, SUM(amount) AS amount, \
                            MIN(external_trade_id) AS trade_id, \
                            MIN(deposit_order_id) AS deposit_order_id, \
                            MAX(confirmed_at) AS confirmed_at \
                     FROM p2p_matches WHERE trade_key IN ({}) \
                     GROUP BY trade_key, status ORDER BY trade_key, status",
                    db::placeholders(chunk.len())
                ))),
                |query, key| query.bind(*key),
            )
            .fetch_all(&mut *conn)
            .await?;
        for row in rows {
            fills.entry(row.trade_key.clone()).or_default().push(row);
        }
    }
    Ok(fills)
}

/// The continuous auditor's reconciliation (an [`ExternalCheck`]): the auditor's window, at
/// most every [`RECONCILE_EVERY`]; the passes in between report the last reconciliation's
/// findings again.
pub struct QuoteReconciler {
    client: QuoteClient,
    every: Duration,
    last: Mutex<Option<(std::time::Instant, Vec<audit::Violation>)>>,
}

impl QuoteReconciler {
    pub fn new(client: QuoteClient) -> Self {
        Self::every(client, RECONCILE_EVERY)
    }

    /// Reconciling at most every `every` (tests: zero, every pass).
    pub fn every(client: QuoteClient, every: Duration) -> Self {
        Self {
            client,
            every,
            last: Mutex::new(None),
        }
    }

    fn last(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<(std::time::Instant, Vec<audit::Violation>)>> {
        self.last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn pass(
        &self,
        conn: &mut MySqlConnection,
        period: Period,
    ) -> Result<Vec<audit::Violation>, ReconcileError> {
        if let Some((at, found)) = self.last().as_ref()
            && at.elapsed() < self.every
        {
            return Ok(found.clone());
        }
        let found = reconcile(conn, &self.client, period.since, period.until).await?;
        let violations = audit::violations(found.discrepancies);
        *self.last() = Some((std::time::Instant::now(), violations.clone()));
        Ok(violations)
    }
}

impl ExternalCheck for QuoteReconciler {
    fn name(&self) -> &'static str {
        "p2p_quote_trades"
    }

    fn run<'c>(&'c self, conn: &'c mut MySqlConnection, period: Period) -> CheckFuture<'c> {
        Box::pin(async move {
            match self.pass(conn, period).await {
                Ok(violations) => Ok(violations),
                Err(ReconcileError::Database(error)) => Err(error),
                Err(ReconcileError::Quote(error)) => {
                    tracing::warn!(
                        error = %paybus_telemetry::one_line(&error),
                        "quote service reconciliation skipped this pass: the service did not answer"
                    );
                    Ok(Vec::new())
                }
            }
        })
    }
}
