//! The match-deposit function (docs/workflows/p2p.md, seed 000): `p2p.deposit_order.created
//! {deposit_order_id}` → claim the PENDING order (a conditional UPDATE to MATCHING stamping
//! `claimed_at`), one matching attempt (`paybus_p2p::Matcher`: reserve, trade with no lock held,
//! settle or release), then outcome accounting in a transaction of its own. What each message
//! ends as is tabled in docs/workflows/p2p.md ("What a message ends as").
//!
//! It offers [`MatchDeposit`] (the handler) and its sweeper jobs, the seed's worker loop and
//! maintenance ([`jobs`]): [`DueOrders`] (retries that came due, orders whose message was lost,
//! orders the reaper handed back), [`ZombieReaper`] and [`Expiry`]. Its dead letters are
//! classified by its triage (terminal order: already applied; PENDING and due: safe; otherwise a
//! human decides).

pub mod jobs;
mod triage;

use std::sync::Arc;

use paybus_bus::{Context, Envelope, Handler, HandlerError, Outcome, Services};
use paybus_config::{Setting, Vars};
use paybus_maintenance::Job;
use paybus_p2p::{
    Accounted, DeadLetters, DepositOrder, DepositOrderCreated, DepositOrderStatus, MatchError,
    Matcher, MatchingConfig, deposit_order,
    matcher::{QuoteContract, TradeFailureReading},
    quote::QuoteClient,
    reconcile::QuoteReconciler,
};
use paybus_retry::Claim;
use paybus_runtime::function::{BuildError, Function};
use sqlx::MySqlPool;

pub use jobs::{DueOrders, Expiry, ZombieReaper};

/// The handler. Build it once at start-up (the matcher owns the quote service client).
pub type MatchDeposit = MatchDepositWith<QuoteContract>;

/// The handler over a matcher that reads a failed createTrade with `R`: deployed, always by the
/// contract ([`MatchDeposit`]); chaos's deliberately broken build is another `R`.
#[derive(Clone, Debug)]
pub struct MatchDepositWith<R: TradeFailureReading> {
    matcher: Matcher<R>,
}

impl<R: TradeFailureReading> MatchDepositWith<R> {
    pub fn new(matcher: Matcher<R>) -> Self {
        Self { matcher }
    }

    pub fn matcher(&self) -> &Matcher<R> {
        &self.matcher
    }
}

/// What the message's claim found.
enum MessageClaim {
    Held(Claim),
    NotDue(DepositOrder),
    Missing,
}

/// The claim, PENDING → MATCHING if due, committed before the attempt: one conditional UPDATE
/// that commits by itself (nothing else belongs with it), then the stamp it wrote. A message
/// that finds the order not due (a duplicate, a late message) reads where it stands with a
/// plain read: no transaction opened, none rolled back.
async fn claim<R: TradeFailureReading>(
    pool: &MySqlPool,
    matcher: &Matcher<R>,
    id: u64,
) -> Result<MessageClaim, MatchError> {
    let mut conn = pool.acquire().await?;
    if let Some(claim) = deposit_order::claim(&mut conn, id, matcher.clock()).await? {
        return Ok(MessageClaim::Held(claim));
    }
    let state = deposit_order::find(&mut conn, id).await?;
    Ok(state.map_or(MessageClaim::Missing, MessageClaim::NotDue))
}

impl<R: TradeFailureReading> Handler for MatchDepositWith<R> {
    type Message = DepositOrderCreated;
    const FUNCTION: &'static str = paybus_p2p::FUNCTION;

    async fn handle(
        &self,
        message: Envelope<DepositOrderCreated>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let id = message.data.deposit_order_id;
        let claim = match claim(ctx.db.pool(), &self.matcher, id).await? {
            MessageClaim::Held(claim) => claim,
            MessageClaim::NotDue(order) => return Ok(not_claimed(&order, ctx.attempt)),
            MessageClaim::Missing => {
                return Ok(Outcome::Failed(format!(
                    "deposit order {id} does not exist"
                )));
            }
        };
        let accounted = self
            .matcher
            .run(&claim, message.correlation_id, DeadLetters::ByTheRuntime)
            .await?;
        Ok(outcome(id, accounted))
    }
}

/// The handler's answer for an attempt's accounting.
fn outcome(id: u64, accounted: Accounted) -> Outcome {
    match accounted {
        Accounted::Terminal { .. } => Outcome::Done,
        Accounted::Retry { after, error, .. } => Outcome::Retry {
            after,
            error: format!("deposit order {id}, {error}"),
        },
        Accounted::GaveUp { error, .. } => Outcome::Failed(error),
        Accounted::Deferred { after, error } => Outcome::Retry {
            after,
            error: format!("deposit order {id}, {error}"),
        },
        Accounted::InDoubt {
            after: Some(after),
            error,
            ..
        } => Outcome::Retry {
            after,
            error: format!("deposit order {id}, {error}"),
        },
        Accounted::InDoubt { error, .. } => Outcome::Failed(error),
        Accounted::ClaimLost { status } => Outcome::Skipped(format!(
            "deposit order {id} was taken over during the attempt (now {})",
            status.map_or_else(|| "gone".to_owned(), |s| s.to_string())
        )),
    }
}

/// Why a message found nothing to match.
fn not_claimed(order: &DepositOrder, delivery_attempt: u32) -> Outcome {
    let id = order.id;
    match order.status {
        // A redelivery of the message that gave the order up: its dead letter may not have
        // been confirmed (a crash after the commit), so it is failed again; the dead letter's
        // id comes from the message id, so one that did get through is still recorded once.
        DepositOrderStatus::Cancelled
            if delivery_attempt > 1
                && order.close_reason == Some(paybus_p2p::CloseReason::MatchFailed) =>
        {
            Outcome::Failed(format!(
                "deposit order {id} is CANCELLED MATCH_FAILED after {} attempts; last error: {}",
                order.match_attempt_count,
                order.last_error.as_deref().unwrap_or("none recorded")
            ))
        }
        // The same for the message that parked the order IN_DOUBT.
        DepositOrderStatus::InDoubt if delivery_attempt > 1 => Outcome::Failed(format!(
            "deposit order {id} is IN_DOUBT: {}",
            order
                .last_error
                .as_deref()
                .unwrap_or("a trade may exist at the quote service")
        )),
        DepositOrderStatus::InDoubt => Outcome::Skipped(format!(
            "deposit order {id} is IN_DOUBT (a trade may exist at the quote service): ops decide"
        )),
        DepositOrderStatus::Pending => Outcome::Skipped(format!(
            "deposit order {id} is waiting for its next attempt (at {}, after {} failed)",
            order.next_attempt_at.map_or_else(
                || "once due".to_owned(),
                |at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            ),
            order.match_attempt_count
        )),
        DepositOrderStatus::Matching => Outcome::Skipped(format!(
            "deposit order {id} is being matched by another attempt (claimed at {})",
            order.claimed_at.map_or_else(
                || "an unknown time".to_owned(),
                |at| at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            )
        )),
        status => Outcome::Skipped(format!("deposit order {id} is already {status}")),
    }
}

impl Function for MatchDeposit {
    const SECRETS: &'static [Setting] = &[paybus_p2p::config::VAR_QUOTE_API_KEY];
    const DEPLOYED_SETTINGS: &'static [Setting] = &[paybus_p2p::config::VAR_QUOTE_URL];

    fn build(services: &Services) -> Result<Self, BuildError> {
        Ok(MatchDeposit::new(matcher(services)?))
    }

    /// The due-orders batch claim, the zombie reaper and expiry.
    fn jobs(services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
        let matcher = matcher(services)?;
        Ok(vec![
            Arc::new(DueOrders::new(matcher.clone())),
            Arc::new(ZombieReaper::new(matcher.clone())),
            Arc::new(Expiry::new(matcher)),
        ])
    }

    /// The reconciliation of settled fills with the quote service's trades (when one is
    /// configured).
    fn external_checks(
        vars: &Vars,
    ) -> Result<Vec<Arc<dyn paybus_ops::audit::ExternalCheck>>, BuildError> {
        let config = MatchingConfig::read(vars)?;
        let client = QuoteClient::new(&config.quote).map_err(|source| BuildError::Client {
            what: "the quote service HTTP client",
            source: source.into(),
        })?;
        Ok(client
            .map(|client| {
                Arc::new(QuoteReconciler::new(client)) as Arc<dyn paybus_ops::audit::ExternalCheck>
            })
            .into_iter()
            .collect())
    }

    const WORK_TABLES: &'static [&'static paybus_retry::WorkTable] =
        &[&paybus_p2p::deposit_order::DEPOSIT_ORDERS];

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: DepositOrderCreated,
    ) -> Result<paybus_ops::triage::Triage, paybus_ops::triage::TriageError> {
        triage::triage(conn, message).await
    }
}

/// The matcher every part of the function uses, from `PAYBUS_MATCH_*` / `PAYBUS_QUOTE_*`.
fn matcher(services: &Services) -> Result<Matcher, BuildError> {
    let config = MatchingConfig::read(&services.settings.vars)?;
    if config.quote.url.is_none() {
        tracing::warn!(
            "PAYBUS_QUOTE_URL is not set: every matching attempt fails (counted) until it is"
        );
    }
    Matcher::new(services.outbox.clone(), config).map_err(|source| BuildError::Client {
        what: "the quote service HTTP client",
        source: source.into(),
    })
}
