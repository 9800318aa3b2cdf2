//! The per-partner circuit breaker of webhook delivery, kept on the partner's row so every
//! process and every Lambda sees the same state (the migration's header comment is the
//! reference):
//!
//! ```text
//!            N consecutive failures               cool-down passed
//! CLOSED ──────────────────────────► OPEN ──────────────────────────► HALF-OPEN
//!   ▲   (deliveries attempted)      (deliveries parked,                 │ one delivery probes
//!   │                                no attempt counted)                │ (conditional UPDATE)
//!   └──────────── probe delivered ◄───────────────────────────────────┘ probe failed: OPEN
//! ```
//!
//! Each statement is one conditional UPDATE on the partner row; nothing is held across a POST.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paybus_retry::{Clock, clock::micros};
use serde::Serialize;
use sqlx::MySqlConnection;

/// The breaker as a delivery read it with its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct BreakerRead {
    pub failures: u32,
    pub open_until: Option<DateTime<Utc>>,
    /// The kit's clock when it was read.
    pub now: DateTime<Utc>,
}

/// Where a partner's breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerRead {
    pub fn state(&self) -> BreakerState {
        match self.open_until {
            None => BreakerState::Closed,
            Some(until) if until > self.now => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// How long until an open breaker lets a probe through.
    pub fn remaining(&self) -> Duration {
        self.open_until
            .and_then(|until| (until - self.now).to_std().ok())
            .unwrap_or(Duration::ZERO)
    }
}

/// The breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive failures that open it.
    pub failures_to_open: u32,
    /// How long it stays open before a probe.
    pub cool_down: Duration,
}

/// Takes the half-open breaker's one probe: true when this delivery is it (the breaker is
/// pushed forward one cool-down, so concurrent deliveries see it open and park).
pub async fn take_probe(
    conn: &mut MySqlConnection,
    partner_id: u64,
    policy: &BreakerPolicy,
    clock: &Clock,
) -> Result<bool, sqlx::Error> {
    let taken = sqlx::query(
        "UPDATE partners \
         SET webhook_open_until = COALESCE(?, NOW(6)) + INTERVAL ? MICROSECOND \
         WHERE id = ? AND webhook_open_until <= COALESCE(?, NOW(6))",
    )
    .bind(clock.sql_now())
    .bind(micros(policy.cool_down))
    .bind(partner_id)
    .bind(clock.sql_now())
    .execute(conn)
    .await?
    .rows_affected();
    Ok(taken == 1)
}

/// A POST was delivered: the breaker closes (a no-op when it was closed with no failures).
/// True when this closed an open or failing breaker.
pub async fn record_success(
    conn: &mut MySqlConnection,
    partner_id: u64,
) -> Result<bool, sqlx::Error> {
    let closed = sqlx::query(
        "UPDATE partners SET webhook_failures = 0, webhook_open_until = NULL, \
         webhook_opened_at = NULL WHERE id = ? AND (webhook_failures <> 0 OR webhook_open_until IS NOT NULL)",
    )
    .bind(partner_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(closed == 1)
}

/// A POST failed: one more consecutive failure; at the threshold the breaker opens for one
/// cool-down. True when this failure opened it.
pub async fn record_failure(
    conn: &mut MySqlConnection,
    partner_id: u64,
    policy: &BreakerPolicy,
    clock: &Clock,
) -> Result<bool, sqlx::Error> {
    sqlx::query("UPDATE partners SET webhook_failures = webhook_failures + 1 WHERE id = ?")
        .bind(partner_id)
        .execute(&mut *conn)
        .await?;
    let opened = sqlx::query(
        "UPDATE partners \
         SET webhook_open_until = COALESCE(?, NOW(6)) + INTERVAL ? MICROSECOND, \
             webhook_opened_at = COALESCE(?, NOW(6)) \
         WHERE id = ? AND webhook_failures >= ? AND webhook_open_until IS NULL",
    )
    .bind(clock.sql_now())
    .bind(micros(policy.cool_down))
    .bind(clock.sql_now())
    .bind(partner_id)
    .bind(policy.failures_to_open)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(opened == 1)
}

/// A partner's breaker now.
pub async fn read(
    conn: &mut MySqlConnection,
    partner_id: u64,
    clock: &Clock,
) -> Result<Option<BreakerRead>, sqlx::Error> {
    sqlx::query_as(
        "SELECT webhook_failures AS failures, webhook_open_until AS open_until, \
                COALESCE(?, NOW(6)) AS now \
         FROM partners WHERE id = ?",
    )
    .bind(clock.sql_now())
    .bind(partner_id)
    .fetch_optional(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_follows_open_until_and_the_clock() {
        let now = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .map(DateTime::<Utc>::from)
            .expect("a timestamp");
        let read = |open_until| BreakerRead {
            failures: 5,
            open_until,
            now,
        };
        assert_eq!(read(None).state(), BreakerState::Closed);
        let open = read(Some(now + chrono::Duration::seconds(30)));
        assert_eq!(open.state(), BreakerState::Open);
        assert_eq!(open.remaining(), Duration::from_secs(30));
        assert_eq!(
            read(Some(now - chrono::Duration::seconds(1))).state(),
            BreakerState::HalfOpen
        );
    }
}

/// A partner whose breaker is not simply closed and clean: open, half-open, or failing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartnerBreaker {
    pub partner_id: u64,
    pub name: String,
    pub state: BreakerState,
    /// Consecutive failed POSTs.
    pub failures: u32,
    pub open_until: Option<DateTime<Utc>>,
}

/// Every partner whose breaker is open or half-open or has failures counted, open ones first
/// (what the ops overview shows; the partial scan is fine: partners are few).
pub async fn not_closed(conn: &mut MySqlConnection) -> Result<Vec<PartnerBreaker>, sqlx::Error> {
    type Row = (u64, String, u32, Option<DateTime<Utc>>, DateTime<Utc>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, name, webhook_failures, webhook_open_until, NOW(6) FROM partners \
         WHERE webhook_open_until IS NOT NULL OR webhook_failures > 0 \
         ORDER BY webhook_open_until IS NULL, webhook_failures DESC, id LIMIT 200",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(partner_id, name, failures, open_until, now)| PartnerBreaker {
                state: BreakerRead {
                    failures,
                    open_until,
                    now,
                }
                .state(),
                partner_id,
                name,
                failures,
                open_until,
            },
        )
        .collect())
}
