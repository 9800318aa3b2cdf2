//! match-deposit's sweeper jobs (seed 000 §4–§5), each a config-free wrapper over the domain's
//! statements (`paybus_p2p::maintenance`) with the matcher's settings: run by `paybus run` on
//! timers and by the sweeper (a scheduled Lambda in AWS). Quiet unless something changed.
//!
//! | job | every | does |
//! | --- | --- | --- |
//! | `due-deposit-orders` | poll interval (1 s) | claims due PENDING orders, a batch (10) at a time, `FOR UPDATE SKIP LOCKED`, commits, then works each one in its own transactions, concurrently, with the same attempt and accounting as the handler; a give-up's dead letter is recorded with its CANCELLED row |
//! | `deposit-order-reaper` | zombie timeout / 5 (1 min) | MATCHING claims older than the zombie timeout (5 min) → PENDING, their reservations released |
//! | `deposit-order-expiry` | 30 s | open orders past `expires_at` → EXPIRED, reservations released |

use std::time::Duration;

use futures_util::future::join_all;
use paybus_bus::{Outcome, metrics};
use paybus_maintenance::{Job, JobFuture, JobReport};
use paybus_p2p::{DeadLetters, Matcher, maintenance};

/// Rows one pass of the reaper or expiry handles per transaction; a pass continues while
/// batches come back full.
const MAINTENANCE_BATCH: u32 = 500;

/// The seed's worker loop: claim a batch of due orders, commit, match each.
#[derive(Debug, Clone)]
pub struct DueOrders {
    matcher: Matcher,
}

impl DueOrders {
    pub fn new(matcher: Matcher) -> Self {
        Self { matcher }
    }

    /// Claims and works batches until one comes back short; returns how many orders it
    /// worked. One order's failure never holds up the others (seed 000 §4): each runs in its
    /// own transactions, and an order whose accounting could not be written stays claimed
    /// for the reaper.
    pub async fn run_once(&self) -> Result<u64, paybus_p2p::MatchError> {
        let batch = self.matcher.config().batch_size;
        let mut worked = 0;
        loop {
            let claims =
                maintenance::claim_due(self.matcher.outbox(), batch, self.matcher.clock()).await?;
            let claimed = claims.len();
            let runs = claims.iter().map(|claim| async move {
                let result = self
                    .matcher
                    .run(claim, uuid::Uuid::now_v7(), DeadLetters::Record)
                    .await;
                match result {
                    // Counted beside the messages' outcomes, so that the console's charts
                    // show the orders this job matches as well as those a message matched.
                    Ok(accounted) => metrics::record(
                        paybus_p2p::FUNCTION,
                        due_order_label(&super::outcome(claim.id, accounted)),
                        Duration::ZERO,
                    ),
                    Err(error) => tracing::warn!(
                        deposit_order_id = claim.id,
                        error = %paybus_telemetry::one_line(&error),
                        "outcome accounting failed; the order stays claimed until the reaper"
                    ),
                }
            });
            join_all(runs).await;
            worked += claimed as u64;
            if claimed < batch as usize {
                break;
            }
        }
        if worked > 0 {
            tracing::info!(
                job = "due-deposit-orders",
                worked,
                "due deposit orders matched"
            );
        }
        Ok(worked)
    }
}

/// The outcome label of an order this job worked (the charts read the part after the last
/// `_`; Prometheus tells them from the messages' by the prefix).
fn due_order_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Done => "due_order_done",
        Outcome::Skipped(_) => "due_order_skipped",
        Outcome::Retry { .. } => "due_order_retry",
        Outcome::Failed(_) => "due_order_failed",
    }
}

impl Job for DueOrders {
    fn name(&self) -> &'static str {
        "due-deposit-orders"
    }

    fn interval(&self) -> Duration {
        self.matcher.config().poll_interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            Ok(JobReport {
                changed: DueOrders::run_once(self).await?,
            })
        })
    }
}

/// Hands orders whose attempt died back to PENDING (seed 000 §5).
#[derive(Debug, Clone)]
pub struct ZombieReaper {
    matcher: Matcher,
}

impl ZombieReaper {
    pub fn new(matcher: Matcher) -> Self {
        Self { matcher }
    }

    /// Reaps every expired claim, batch by batch; returns how many.
    pub async fn run_once(&self) -> Result<u64, paybus_p2p::MatchError> {
        let mut reaped = 0;
        loop {
            let ids = maintenance::reap_zombies(
                self.matcher.outbox(),
                self.matcher.config().zombie_timeout,
                MAINTENANCE_BATCH,
                self.matcher.clock(),
            )
            .await?;
            reaped += ids.len() as u64;
            if ids.len() < MAINTENANCE_BATCH as usize {
                return Ok(reaped);
            }
        }
    }
}

impl Job for ZombieReaper {
    fn name(&self) -> &'static str {
        "deposit-order-reaper"
    }

    fn interval(&self) -> Duration {
        self.matcher.config().reaper_interval()
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            Ok(JobReport {
                changed: ZombieReaper::run_once(self).await?,
            })
        })
    }
}

/// Closes open orders past their `expires_at`.
#[derive(Debug, Clone)]
pub struct Expiry {
    matcher: Matcher,
}

impl Expiry {
    pub fn new(matcher: Matcher) -> Self {
        Self { matcher }
    }

    /// Expires every order due, batch by batch; returns how many.
    pub async fn run_once(&self) -> Result<u64, paybus_p2p::MatchError> {
        let mut expired = 0;
        loop {
            let ids = maintenance::expire_due(
                self.matcher.outbox(),
                self.matcher.config().zombie_timeout,
                MAINTENANCE_BATCH,
                self.matcher.clock(),
            )
            .await?;
            expired += ids.len() as u64;
            if ids.len() < MAINTENANCE_BATCH as usize {
                return Ok(expired);
            }
        }
    }
}

impl Job for Expiry {
    fn name(&self) -> &'static str {
        "deposit-order-expiry"
    }

    fn interval(&self) -> Duration {
        self.matcher.config().expiry_interval
    }

    fn run_once(&self) -> JobFuture<'_> {
        Box::pin(async move {
            Ok(JobReport {
                changed: Expiry::run_once(self).await?,
            })
        })
    }
}
