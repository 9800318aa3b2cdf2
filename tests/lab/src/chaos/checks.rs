//! What a chaos run must end in, read from the database and the broker: quiescence within a
//! bound, every item terminal, the audit clean (this build's at the end, and the fleet's
//! continuous auditor's throughout), every malformed message a dead letter with
//! reason `malformed` and no other dead letter without a cause, no message in any queue,
//! every webhook delivered or FAILED and what the partner received consistent with it (at
//! least once, never under two ids), W1's trades reconciled with the quote service, no client
//! request without a definitive answer.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use paybus_bus::{Services, topology};
use paybus_p2p::reconcile;
use paybus_testkit::p2p::QuoteStub;
use serde::Serialize;
use sqlx::MySqlPool;

use super::{
    broker::ready,
    duplicator::{Duplicator, TAP_QUEUE},
    load::Load,
    outside::Webhooks,
};

/// One thing the run proved wrong.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub check: String,
    pub detail: String,
}

pub(crate) fn violation(check: &str, detail: impl Into<String>) -> Violation {
    Violation {
        check: check.to_owned(),
        detail: detail.into(),
    }
}

/// Rows that are not terminal (each count must be 0 at quiescence), with the rule they break.
const NOT_TERMINAL: &[(&str, &str)] = &[
    (
        "p2p: deposit orders PENDING, MATCHING or IN_DOUBT",
        "SELECT COUNT(*) FROM p2p_deposit_orders \
         WHERE status IN ('PENDING', 'MATCHING', 'IN_DOUBT')",
    ),
    (
        "p2p: matches still RESERVED or TRADING (a trade in doubt)",
        "SELECT COUNT(*) FROM p2p_matches WHERE status IN ('RESERVED', 'TRADING')",
    ),
    (
        "confirmations: withdrawals not CONFIRMED",
        "SELECT COUNT(*) FROM withdrawals WHERE status <> 'CONFIRMED'",
    ),
    (
        "confirmations: deposits not CONFIRMED",
        "SELECT COUNT(*) FROM deposits WHERE status <> 'CONFIRMED'",
    ),
    (
        "bonuses: purchases not COMPLETE",
        "SELECT COUNT(*) FROM charges WHERE status = 'CHARGE' AND payment_status <> 'COMPLETE'",
    ),
    (
        "bonuses: bonus jobs PENDING or PROCESSING",
        "SELECT COUNT(*) FROM charge_event_job WHERE status IN ('PENDING', 'PROCESSING')",
    ),
    (
        "markets: markets not SUSPENDED",
        "SELECT COUNT(*) FROM markets WHERE status <> 'SUSPENDED'",
    ),
    (
        "markets: suspensions not materialised",
        "SELECT COUNT(*) FROM task_batches WHERE materialised_at IS NULL",
    ),
    (
        "markets: cancel tasks PENDING",
        "SELECT COUNT(*) FROM tasks WHERE state = 'PENDING'",
    ),
    (
        "markets: open orders in suspended markets",
        "SELECT COUNT(*) FROM orders o JOIN markets m ON m.id = o.market_id \
         WHERE m.status = 'SUSPENDED' AND o.status IN ('OPEN', 'PARTIALLY_FILLED')",
    ),
    (
        "webhooks neither delivered nor FAILED",
        "SELECT COUNT(*) FROM partner_notifications WHERE status = 'PENDING'",
    ),
    (
        "outbox messages not published",
        "SELECT COUNT(*) FROM outbox_messages WHERE published_at IS NULL",
    ),
];

pub(crate) async fn not_terminal(pool: &MySqlPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let mut found = Vec::new();
    for (what, sql) in NOT_TERMINAL {
        let n: i64 = sqlx::query_scalar(*sql).fetch_one(pool).await?;
        if n > 0 {
            found.push(((*what).to_owned(), n));
        }
    }
    Ok(found)
}

/// Every queue of the run: the functions', their dead-letter queues, the unrouted queue and
/// the tap.
fn all_queues(services: &Services) -> Vec<String> {
    let mut queues: Vec<String> = paybus_catalog::queues(&services.settings.broker.shards)
        .iter()
        .flat_map(|q| [q.queue(), q.dead_letter_queue()])
        .collect();
    queues.push(topology::UNROUTED_QUEUE.to_owned());
    queues.push(TAP_QUEUE.to_owned());
    queues
}

/// Messages in each non-empty queue (ready ones; with no consumer left, that is all of them).
pub(crate) async fn queue_depths(services: &Services) -> Result<Vec<(String, u32)>, lapin::Error> {
    let channel = services.connection().create_channel().await?;
    let mut found = Vec::new();
    for queue in all_queues(services) {
        let n = ready(&channel, &queue).await?;
        if n > 0 {
            found.push((queue, n));
        }
    }
    let _ = channel.close(200, "done".into()).await;
    Ok(found)
}

/// Whether the run went quiet in time, and what was still moving if not.
#[derive(Debug, Clone, Serialize)]
pub struct Quiescence {
    pub reached: bool,
    pub still_moving: Vec<String>,
}

/// Polls until nothing is pending in the database and every queue is empty, twice in a row
/// (a message between two polls must not pass for quiet), or `timeout`.
pub(crate) async fn await_quiescence(
    services: &Services,
    _duplicator: &Duplicator,
    _load: &Load,
    timeout: Duration,
) -> Quiescence {
    let deadline = Instant::now() + timeout;
    let mut quiet_polls = 0;
    let mut last = Vec::new();
    loop {
        let mut moving = Vec::new();
        match not_terminal(&services.pool).await {
            Ok(rows) => moving.extend(rows.into_iter().map(|(what, n)| format!("{what}: {n}"))),
            Err(e) => moving.push(format!("database: {e}")),
        }
        match queue_depths(services).await {
            Ok(queues) => moving.extend(
                queues
                    .into_iter()
                    .map(|(queue, n)| format!("queue {queue}: {n} message(s)")),
            ),
            Err(e) => moving.push(format!("broker: {e}")),
        }
        quiet_polls = if moving.is_empty() {
            quiet_polls + 1
        } else {
            0
        };
        if quiet_polls >= 2 {
            return Quiescence {
                reached: true,
                still_moving: Vec::new(),
            };
        }
        if Instant::now() >= deadline {
            return Quiescence {
                reached: false,
                still_moving: if moving.is_empty() { last } else { moving },
            };
        }
        last = moving;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Dead letters a function owes for items it gave up on (a visible, terminal failure): the
/// rows in that failed state. Any other dead letter, or more of them than such rows, has no
/// explained cause.
const FAILED_ITEMS: &[(&str, &str)] = &[
    (
        "match-deposit",
        "SELECT COUNT(*) FROM p2p_deposit_orders \
         WHERE close_reason = 'MATCH_FAILED' OR status = 'IN_DOUBT'",
    ),
    (
        "deliver-webhook",
        "SELECT COUNT(*) FROM partner_notifications WHERE status = 'FAILED'",
    ),
    (
        "grant-bonus",
        "SELECT COUNT(*) FROM charge_event_job WHERE status = 'FAILED'",
    ),
    (
        "cancel-orders",
        "SELECT COUNT(*) FROM tasks WHERE state = 'FAILED'",
    ),
];

/// Dead letters by function and reason.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetters {
    pub function: String,
    pub reason: String,
    pub count: i64,
}

pub(crate) async fn dead_letters_by_reason(
    pool: &MySqlPool,
) -> Result<Vec<DeadLetters>, sqlx::Error> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT function_name, reason, COUNT(*) FROM dead_letters \
         GROUP BY function_name, reason ORDER BY function_name, reason",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(function, reason, count)| DeadLetters {
            function,
            reason,
            count,
        })
        .collect())
}

/// The marker of a malformed message the run injected, read back from a dead letter's body.
fn marker_of(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?;
    let rest = text.strip_prefix("{\"chaos_malformed\": ")?;
    rest.split(',').next()?.trim().parse().ok()
}

async fn malformed_dead_letters(
    pool: &MySqlPool,
    injected: &[u64],
) -> Result<Vec<Violation>, sqlx::Error> {
    let bodies: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT body FROM dead_letters WHERE reason = 'malformed'")
            .fetch_all(pool)
            .await?;
    let mut found = BTreeSet::new();
    let mut violations = Vec::new();
    for body in bodies {
        match marker_of(&body) {
            Some(marker) => {
                found.insert(marker);
            }
            None => violations.push(violation(
                "unexplained_dead_letter",
                format!(
                    "a malformed dead letter the run did not inject: {}",
                    String::from_utf8_lossy(&body)
                        .chars()
                        .take(120)
                        .collect::<String>()
                ),
            )),
        }
    }
    let missing: Vec<u64> = injected
        .iter()
        .filter(|m| !found.contains(m))
        .copied()
        .collect();
    if !missing.is_empty() {
        violations.push(violation(
            "malformed_not_dead_lettered",
            format!(
                "{} of {} malformed messages have no dead letter with reason malformed (markers {missing:?})",
                missing.len(),
                injected.len()
            ),
        ));
    }
    Ok(violations)
}

async fn other_dead_letters(pool: &MySqlPool) -> Result<Vec<Violation>, sqlx::Error> {
    let mut violations = Vec::new();
    for group in dead_letters_by_reason(pool).await? {
        if group.reason == "malformed" {
            continue;
        }
        let owed = match FAILED_ITEMS.iter().find(|(f, _)| *f == group.function) {
            Some((_, sql)) if group.reason == "failed" => {
                sqlx::query_scalar::<_, i64>(*sql).fetch_one(pool).await?
            }
            _ => 0,
        };
        if group.count > owed {
            violations.push(violation(
                "unexplained_dead_letter",
                format!(
                    "{} dead letter(s) of {} with reason {} ({} item(s) of it failed visibly)",
                    group.count, group.function, group.reason, owed
                ),
            ));
        }
    }
    Ok(violations)
}

/// W1's settled fills against the quote service's trades, over the whole run (nothing moves
/// at quiescence, so every trade is judged): no orphan trade, no missing trade — at the end
/// (paybus's own reconciliation) and at any moment of the run ([`orphaned_for_a_while`]).
async fn quote_reconciliation(
    pool: &MySqlPool,
    quotes: &QuoteStub,
    since: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Vec<Violation>> {
    let until = chrono::Utc::now()
        + chrono::Duration::from_std(reconcile::CLOCK_SKEW + Duration::from_secs(1))?;
    let mut tx = pool.begin().await?;
    let found = reconcile::reconcile(&mut tx, &quotes.client(), since, until).await?;
    tx.rollback().await?;
    let orphans_at_the_end: BTreeSet<&str> = found
        .discrepancies
        .iter()
        .filter_map(|d| match d {
            reconcile::Discrepancy::OrphanTrade { trade_key, .. } => Some(trade_key.as_str()),
            _ => None,
        })
        .collect();
    let for_a_while = orphaned_for_a_while(pool, quotes, &orphans_at_the_end).await?;
    Ok(found
        .discrepancies
        .iter()
        .map(|d| {
            violation(
                &format!("reconcile:{}", paybus_ops::audit::Finding::check(d)),
                d.to_string(),
            )
        })
        .chain(found.in_doubt.iter().map(|doubt| {
            violation(
                "reconcile:in_doubt",
                format!(
                    "fill {} of deposit order {} still in doubt at quiescence",
                    doubt.trade_key, doubt.deposit_order_id
                ),
            )
        }))
        .chain(for_a_while)
        .collect())
}

/// What the partners' endpoint saw, set against the notifications paybus recorded: every
/// notification paybus marked DELIVERED was received with a 2xx at least once (delivery is at
/// least once), a notification is never sent under two ids (the partner dedupes by
/// `webhook-id`: a second id is a second notification to it), and nothing is received that
/// paybus never owed. Also the redeliveries counted: the same id received again after an
/// answer the sender did not see in time.
pub(crate) async fn webhook_deliveries(
    pool: &MySqlPool,
    webhooks: &Webhooks,
) -> anyhow::Result<(Vec<Violation>, WebhookFigures)> {
    let received = webhooks.received();
    let mut violations = Vec::new();
    let mut by_id: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    let mut ids_by_notification: BTreeMap<(&str, &[u8]), BTreeSet<&str>> = BTreeMap::new();
    for r in &received {
        let (posts, accepted) = by_id.entry(&r.webhook_id).or_default();
        *posts += 1;
        if (200..300).contains(&r.status) {
            *accepted += 1;
        }
        ids_by_notification
            .entry((&r.event, &r.payload))
            .or_default()
            .insert(&r.webhook_id);
    }
    for ((event, _), ids) in &ids_by_notification {
        if ids.len() > 1 {
            violations.push(violation(
                "webhook_under_two_ids",
                format!(
                    "one {event} notification received under {} ids: {}",
                    ids.len(),
                    ids.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    let delivered: Vec<u64> =
        sqlx::query_scalar("SELECT id FROM partner_notifications WHERE status = 'DELIVERED'")
            .fetch_all(pool)
            .await?;
    let unseen: Vec<String> = delivered
        .iter()
        .map(u64::to_string)
        .filter(|id| {
            by_id
                .get(id.as_str())
                .is_none_or(|(_, accepted)| *accepted == 0)
        })
        .collect();
    if !unseen.is_empty() {
        violations.push(violation(
            "webhook_delivered_unseen",
            format!(
                "{} notification(s) DELIVERED that the partner never accepted, e.g. {}",
                unseen.len(),
                unseen
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let owed: BTreeSet<String> =
        sqlx::query_scalar::<_, u64>("SELECT id FROM partner_notifications")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|id| id.to_string())
            .collect();
    let phantom: Vec<&str> = by_id
        .keys()
        .copied()
        .filter(|id| !owed.contains(*id))
        .collect();
    if !phantom.is_empty() {
        violations.push(violation(
            "webhook_never_owed",
            format!(
                "{} webhook id(s) received that no notification has, e.g. {}",
                phantom.len(),
                phantom
                    .iter()
                    .take(5)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let figures = WebhookFigures {
        posts: received.len() as u64,
        notifications: by_id.len() as u64,
        accepted_again: by_id
            .values()
            .map(|(_, accepted)| u64::from(accepted.saturating_sub(1)))
            .sum(),
        answered_late: received
            .iter()
            .filter(|r| r.late && (200..300).contains(&r.status))
            .count() as u64,
    };
    Ok((violations, figures))
}

/// The partners' endpoint in figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WebhookFigures {
    /// POSTs received, and the notifications (distinct ids) among them.
    pub posts: u64,
    pub notifications: u64,
    /// 2xx answers beyond the first per notification: at-least-once's repeats.
    pub accepted_again: u64,
    /// POSTs accepted after the sender's timeout (the late phase).
    pub answered_late: u64,
}

/// A fill paybus released after the quote service had made its trade.
#[derive(sqlx::FromRow)]
struct ReleasedFill {
    trade_key: String,
    deposit_order_id: u64,
    release_reason: String,
    released_at: chrono::DateTime<chrono::Utc>,
}

/// Orphan trades of the run's history: a trade whose fill paybus released *after* the quote
/// service had made it. From that release on, nothing in paybus held the seller's liquidity
/// behind a trade that existed (another buyer could take it, or the order could close), even
/// when a later attempt settled the trade under the same key and left clean books — which is
/// all paybus's end-of-run reconciliation sees, so a build that releases on an *unknown*
/// outcome passes it whenever its retry happens to find the trade. Principle 12 forbids the
/// release itself. A chaos run can order the two events exactly: the stub's trades and the
/// database's `released_at` are read off this machine's one clock (paybus's reconciliation,
/// against a counterparty's clock, allows `CLOCK_SKEW` and judges the end state only). In a
/// correct build no fill is ever released after its trade exists: a fill is released only
/// before createTrade is sent, on a definitive refusal of the first request, or when the key's
/// lookup found no trade. Keys already reported as orphans at the end are not repeated.
async fn orphaned_for_a_while(
    pool: &MySqlPool,
    quotes: &QuoteStub,
    orphans_at_the_end: &BTreeSet<&str>,
) -> Result<Vec<Violation>, sqlx::Error> {
    let released: Vec<ReleasedFill> = sqlx::query_as(
        "SELECT trade_key, deposit_order_id, release_reason, released_at FROM p2p_matches \
         WHERE status = 'RELEASED' ORDER BY released_at, id",
    )
    .fetch_all(pool)
    .await?;
    let settled: BTreeSet<String> =
        sqlx::query_scalar("SELECT DISTINCT trade_key FROM p2p_matches WHERE status = 'CONFIRMED'")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let trades = quotes.trades();
    let mut reported = BTreeSet::new();
    let mut violations = Vec::new();
    for fill in released {
        let Some(trade) = trades.get(&fill.trade_key) else {
            continue;
        };
        if fill.released_at <= trade.created_at
            || orphans_at_the_end.contains(fill.trade_key.as_str())
            || !reported.insert(fill.trade_key.clone())
        {
            continue;
        }
        let later = (fill.released_at - trade.created_at).num_milliseconds();
        let then = if settled.contains(&fill.trade_key) {
            "; a later attempt settled it under the same key, but until then it was an orphan"
        } else {
            ""
        };
        violations.push(violation(
            "reconcile:p2p_orphan_trade",
            format!(
                "p2p_orphan_trade: the quote service made trade {} for {} {} under key {}; \
                 paybus released that fill of deposit order {} ({}) {later} ms later, while \
                 the trade stood{then}",
                trade.trade_id,
                trade.amount,
                trade.currency,
                fill.trade_key,
                fill.deposit_order_id,
                fill.release_reason
            ),
        ));
    }
    Ok(violations)
}

/// What the fleet's continuous auditor (the sweeper, of whichever release ran it) recorded
/// during the run. In production each is an alarm, and during a Lambda deploy a rollback: a
/// release whose rows the previous release's auditor misreads fails its deploy there.
async fn auditor_findings(pool: &MySqlPool) -> Result<Vec<Violation>, sqlx::Error> {
    let found: Vec<(String, u32)> =
        sqlx::query_as("SELECT description, times_seen FROM audit_findings ORDER BY id")
            .fetch_all(pool)
            .await?;
    Ok(found
        .into_iter()
        .map(|(description, passes)| {
            violation(
                "auditor_finding",
                format!("{description} (found by {passes} pass(es) of the fleet's auditor)"),
            )
        })
        .collect())
}

/// Every check, after quiescence and with every function process stopped.
pub(crate) async fn run_all(
    services: &Services,
    duplicator: &Duplicator,
    load: &Load,
    quotes: &QuoteStub,
    started_at: chrono::DateTime<chrono::Utc>,
    quiescence: Quiescence,
) -> anyhow::Result<Vec<Violation>> {
    let pool = &services.pool;
    let mut violations = Vec::new();
    if !quiescence.reached {
        violations.push(violation(
            "no_quiescence",
            format!(
                "still moving at the deadline: {}",
                quiescence.still_moving.join("; ")
            ),
        ));
    }
    for (what, n) in not_terminal(pool).await? {
        violations.push(violation("not_terminal", format!("{what}: {n}")));
    }
    let mut conn = pool.acquire().await?;
    // One check at a time, and one that cannot run is a finding, not the run's end: on a
    // schema the deploy left behind (a migration refused) this release's checks may read
    // columns it lacks, and the report must still show why.
    for check in paybus_catalog::audit_checks() {
        match (check.run)(&mut conn).await {
            Ok(found) => violations.extend(
                found
                    .into_iter()
                    .map(|found| violation(&format!("audit:{}", found.check), found.description)),
            ),
            Err(e) => violations.push(violation("audit_not_run", format!("{}: {e}", check.name))),
        }
    }
    drop(conn);
    violations.extend(auditor_findings(pool).await?);
    violations.extend(quote_reconciliation(pool, quotes, started_at).await?);
    violations.extend(malformed_dead_letters(pool, &duplicator.malformed()).await?);
    violations.extend(other_dead_letters(pool).await?);
    for (queue, n) in queue_depths(services).await? {
        violations.push(violation(
            "message_left_in_queue",
            format!("{queue}: {n} message(s)"),
        ));
    }
    for lost in load.lost() {
        violations.push(violation("request_lost", lost));
    }
    Ok(violations)
}

/// Rows by state, per workflow table (the report's counts).
pub(crate) async fn counts(
    pool: &MySqlPool,
) -> Result<BTreeMap<String, BTreeMap<String, i64>>, sqlx::Error> {
    const BY_STATE: &[(&str, &str)] = &[
        (
            "p2p: deposit orders",
            "SELECT COALESCE(CONCAT(status, ' ', close_reason), status), COUNT(*) FROM p2p_deposit_orders GROUP BY 1",
        ),
        (
            "p2p: matches",
            "SELECT status, COUNT(*) FROM p2p_matches GROUP BY status",
        ),
        (
            "confirmations: withdrawals",
            "SELECT status, COUNT(*) FROM withdrawals GROUP BY status",
        ),
        (
            "confirmations: deposits",
            "SELECT status, COUNT(*) FROM deposits GROUP BY status",
        ),
        (
            "bonuses: charges",
            "SELECT CONCAT(status, ' ', payment_status), COUNT(*) FROM charges GROUP BY 1",
        ),
        (
            "bonuses: bonus jobs",
            "SELECT status, COUNT(*) FROM charge_event_job GROUP BY status",
        ),
        (
            "markets: orders",
            "SELECT status, COUNT(*) FROM orders GROUP BY status",
        ),
        (
            "markets: cancel tasks",
            "SELECT state, COUNT(*) FROM tasks GROUP BY state",
        ),
        (
            "webhooks",
            "SELECT status, COUNT(*) FROM partner_notifications GROUP BY status",
        ),
        (
            "ledger entries",
            "SELECT entry_type, COUNT(*) FROM ledger_entries GROUP BY entry_type",
        ),
    ];
    let mut all = BTreeMap::new();
    for (what, sql) in BY_STATE {
        let rows: Vec<(String, i64)> = sqlx::query_as(*sql).fetch_all(pool).await?;
        all.insert((*what).to_owned(), rows.into_iter().collect());
    }
    Ok(all)
}
