//! The matching attempt (inline in the create API, match-deposit's handler and its due-orders
//! job) and its outcome accounting; docs/workflows/p2p.md has the flow. Every transaction runs
//! READ COMMITTED: each decision is a locking read or a guarded UPDATE, so no gap lock stalls a
//! concurrent reserve inserting its matches. createTrade's outcomes: [`crate::quote`].
//!
//! ```text
//!  claim (committed) ─► reserve (short tx) ─► getQuote ─► mark TRADING ─► createTrade ─► settle (short tx)
//!                         │   │                  │        (one UPDATE,       │  no transaction open,
//!                         │   │                  │         committed first)  │  no row locked
//!                         │   │                  └ failed: release ◄─────────┤ refused (4xx): release
//!                         │   └ a fill in doubt: createTrade again, same key ┘ unknown: keep it TRADING
//!                         └ fill-or-cancel short: CANCELLED, no call                   │
//!                                                                                        ▼
//!                                          outcome accounting (its own tx): re-read, count, retry or give up
//! ```

use std::time::Duration;

use paybus_bus::{Envelope, Outbox};
use paybus_retry::{Claim, Clock};
use uuid::Uuid;

use crate::{
    CreateError, Inserted, MatchError,
    accounting::{self, Accounted, AttemptEnd, DeadLetters, Policies},
    config::MatchingConfig,
    deposit_order::{self, NewDepositOrder, Start},
    matches::ReleaseReason,
    messages::DepositOrderCreated,
    quote::{Effect, Quote, QuoteClient, QuoteError, QuoteRequest, TradeRequest},
    reserve::{self, Fill, Reservation},
    settle::{self, Settled},
};

/// How often a fill-or-cancel attempt looks again when only other matchers' locks kept it
/// from filling, and the first pause (doubling).
const CONTENDED_TRIES: u32 = 5;
const CONTENDED_PAUSE: Duration = Duration::from_millis(10);

/// How the create API hands a new order to matching (`PAYBUS_ASYNC_MATCHING_ENABLED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// Switch off (the default, seed 000 §0): inserted already claimed (MATCHING) and matched
    /// inside the request — still with no lock across the quote call.
    Inline,
    /// Switch on: PENDING, with a `p2p.deposit_order.created` message in the same transaction.
    Queued,
}

/// What [`Matcher::create`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The partner already created an order with this reference: nothing new.
    Existing(u64),
    /// PENDING, its message on the way to match-deposit.
    Queued(u64),
    /// Matched inline: the attempt's accounting.
    Attempted { id: u64, accounted: Accounted },
}

impl Created {
    pub fn id(&self) -> u64 {
        match self {
            Created::Existing(id) | Created::Queued(id) | Created::Attempted { id, .. } => *id,
        }
    }
}

/// What a matcher makes of a failed createTrade: what the call left at the quote service
/// (principle 12). Every deployed matcher reads it by the contract ([`QuoteContract`]). A type
/// parameter, not a field or a feature, so that a deployed matcher's type has no other reading
/// to switch to, while chaos's deliberately broken match-deposit
/// (`tests/src/bin/match-deposit-releases-on-timeout.rs`) is the real matcher with this one
/// reading replaced: whatever the harness catches is that misreading.
pub trait TradeFailureReading:
    Clone + std::fmt::Debug + std::marker::Send + Sync + 'static
{
    fn effect(&self, error: &QuoteError) -> Effect;
}

/// The quote service's contract: [`QuoteError::effect`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuoteContract;

impl TradeFailureReading for QuoteContract {
    fn effect(&self, error: &QuoteError) -> Effect {
        error.effect()
    }
}

/// Matches deposit orders. Build it once per process (it owns the quote service client).
#[derive(Clone)]
pub struct Matcher<R: TradeFailureReading = QuoteContract> {
    outbox: Outbox,
    quote: Option<QuoteClient>,
    config: MatchingConfig,
    clock: Clock,
    reading: R,
}

impl<R: TradeFailureReading> std::fmt::Debug for Matcher<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matcher")
            .field("quote", &self.quote)
            .field("config", &self.config)
            .field("clock", &self.clock)
            .field("reading", &self.reading)
            .finish_non_exhaustive()
    }
}

impl Matcher {
    /// Builds the quote service client (none when `config.quote.url` is unset: attempts then
    /// fail with that reason, counted like any failure).
    pub fn new(outbox: Outbox, config: MatchingConfig) -> Result<Self, reqwest::Error> {
        Ok(Self {
            quote: QuoteClient::new(&config.quote)?,
            outbox,
            config,
            clock: Clock::Database,
            reading: QuoteContract,
        })
    }
}

impl<R: TradeFailureReading> Matcher<R> {
    /// The same matcher reading failed createTrade calls with `reading`: only the
    /// classification changes (reserve, the TRADING mark, the calls, settle, release and the
    /// accounting stay the real ones).
    pub fn reading_trade_failures<S: TradeFailureReading>(self, reading: S) -> Matcher<S> {
        Matcher {
            outbox: self.outbox,
            quote: self.quote,
            config: self.config,
            clock: self.clock,
            reading,
        }
    }

    /// What a failed createTrade left at the quote service (principle 12, [`crate::quote`]).
    fn trade_effect(&self, error: &QuoteError) -> Effect {
        self.reading.effect(error)
    }

    /// The same matcher on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &MatchingConfig {
        &self.config
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Whether a quote service is configured.
    pub fn can_trade(&self) -> bool {
        self.quote.is_some()
    }

    /// Creates a deposit order and hands it to matching. A repeated partner reference returns
    /// the order already created.
    #[tracing::instrument(skip_all, fields(partner_id = new.partner_id, deposit_order_id))]
    pub async fn create(
        &self,
        new: &NewDepositOrder,
        handoff: Handoff,
    ) -> Result<Created, CreateError> {
        let correlation_id = Uuid::now_v7();
        let ttl = self.config.order_ttl;
        match handoff {
            Handoff::Queued => {
                let mut uow = self.outbox.begin().await?;
                let id =
                    match deposit_order::insert(&mut uow, new, ttl, &self.clock, Start::Pending)
                        .await?
                    {
                        Inserted::Existing(id) => {
                            uow.rollback().await?;
                            return Ok(Created::Existing(id));
                        }
                        Inserted::New(id) => id,
                    };
                tracing::Span::current().record("deposit_order_id", id);
                uow.send(&Envelope::with_correlation(
                    correlation_id,
                    DepositOrderCreated {
                        deposit_order_id: id,
                    },
                ))
                .await?;
                uow.commit().await?;
                Ok(Created::Queued(id))
            }
            Handoff::Inline => {
                // Inserted already claimed by this request, in one statement of its own (no
                // message goes with it): nobody ever sees it PENDING, so the due-orders job
                // never races the request for it, and if this process dies the reaper hands
                // it back.
                let mut conn = self.outbox.pool().acquire().await?;
                let id =
                    match deposit_order::insert(&mut conn, new, ttl, &self.clock, Start::Claimed)
                        .await?
                    {
                        Inserted::Existing(id) => return Ok(Created::Existing(id)),
                        Inserted::New(id) => id,
                    };
                tracing::Span::current().record("deposit_order_id", id);
                let claim = deposit_order::claim_of_new(&mut conn, id).await?;
                drop(conn);
                let accounted = self
                    .run(&claim, correlation_id, DeadLetters::Record)
                    .await?;
                Ok(Created::Attempted { id, accounted })
            }
        }
    }

    /// One attempt on a claimed order, then its outcome accounting (seed 000 §4 ② and ③).
    /// Only the accounting's own database errors come back as errors: every failure of the
    /// attempt is counted.
    pub async fn run(
        &self,
        claim: &Claim,
        correlation_id: Uuid,
        dead_letters: DeadLetters,
    ) -> Result<Accounted, MatchError> {
        let attempt = self.attempt(claim, correlation_id).await;
        if let Ok(AttemptEnd::Closed(reason)) = &attempt {
            // The attempt closed the order itself, with a conditional UPDATE under its claim
            // that matched the row, in a transaction it committed: the row already said so
            // (principle 4). Accounting would lock the order, find it terminal and roll back
            // (four statements and a rollback on every matched order).
            return Ok(Accounted::Terminal {
                status: reason.status(),
                reason: Some(*reason),
            });
        }
        if let Err(error) = &attempt {
            tracing::warn!(
                deposit_order_id = claim.id,
                error = %paybus_telemetry::one_line(error),
                "matching attempt failed"
            );
        }
        accounting::account(
            &self.outbox,
            claim,
            &attempt,
            Policies {
                attempts: &self.config.retry,
                trade_checks: &self.config.trade_checks,
            },
            &self.clock,
            dead_letters,
            correlation_id,
        )
        .await
    }

    /// The attempt itself: reserve (or find a fill in doubt), trade with no lock held, settle
    /// or release.
    #[tracing::instrument(skip_all, fields(deposit_order_id = claim.id, attempt = claim.attempts + 1))]
    pub async fn attempt(
        &self,
        claim: &Claim,
        correlation_id: Uuid,
    ) -> Result<AttemptEnd, MatchError> {
        let quote = self.quote.as_ref().ok_or(QuoteError::NotConfigured)?;
        let mut pause = CONTENDED_PAUSE;
        let mut tries = 0;
        let fill = loop {
            tries += 1;
            let reserved = reserve::reserve(
                &self.outbox,
                claim,
                self.config.fill_policy,
                &self.clock,
                correlation_id,
            )
            .await;
            let reservation = match reserved {
                // Two matchers reserving from one seller while a third marks its fill TRADING
                // can deadlock on the matches' index (seen under load); the victim's
                // reservation was rolled back whole, so it is contention: look again shortly.
                Err(error) if error.is_deadlock() && tries < CONTENDED_TRIES => {
                    tracing::debug!(
                        deposit_order_id = claim.id,
                        tries,
                        "reservation deadlocked; trying again"
                    );
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    continue;
                }
                reserved => reserved?,
            };
            match reservation {
                Reservation::Held(fill) => break fill,
                Reservation::InDoubt(fill) => {
                    let sent = fill.sent.clone().ok_or_else(|| {
                        MatchError::inconsistent("a fill in doubt without the quote it was sent at")
                    })?;
                    tracing::info!(
                        deposit_order_id = claim.id, trade_key = %fill.trade_key,
                        checks = fill.trade_checks,
                        "a fill is in doubt: asking the quote service again under its key"
                    );
                    return self
                        .trade(quote, claim, &fill, &sent, Send::Again, correlation_id)
                        .await;
                }
                Reservation::Closed(reason) => return Ok(AttemptEnd::Closed(reason)),
                Reservation::ClaimLost => return Ok(AttemptEnd::ClaimLost),
                Reservation::NothingAvailable { remaining } => {
                    return Ok(AttemptEnd::NotFilled {
                        remaining,
                        why: "no liquidity available".to_owned(),
                    });
                }
                Reservation::Contended { remaining } if tries >= CONTENDED_TRIES => {
                    return Ok(AttemptEnd::Contended { remaining });
                }
                Reservation::Contended { .. } => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        };

        // No transaction is open here: the reservation committed, the claim keeps others off.
        let reference = reference(claim.id);
        let priced = match quote
            .quote(&QuoteRequest {
                currency: &fill.currency,
                amount: fill.total,
                reference: &reference,
            })
            .await
        {
            Ok(priced) => priced,
            Err(error) => {
                // A quote has no side effect: nothing was traded.
                settle::release(&self.outbox, claim, &fill, ReleaseReason::QuoteFailed).await?;
                return Err(error.into());
            }
        };
        // From this commit on, the trade may exist: a crash or a lost answer leaves the fill
        // in doubt, held, never released.
        if !settle::mark_trading(&self.outbox, &fill, &priced).await? {
            return Ok(AttemptEnd::ClaimLost);
        }
        self.trade(quote, claim, &fill, &priced, Send::First, correlation_id)
            .await
    }

    /// createTrade for a TRADING fill (sent now for the first time, or again under the same
    /// key and body), and what its outcome makes of the fill.
    async fn trade(
        &self,
        client: &QuoteClient,
        claim: &Claim,
        fill: &Fill,
        quote: &Quote,
        send: Send,
        correlation_id: Uuid,
    ) -> Result<AttemptEnd, MatchError> {
        let reference = reference(claim.id);
        let request = TradeRequest {
            quote_id: &quote.quote_id,
            currency: &fill.currency,
            amount: fill.total,
            reference: &reference,
            key: &fill.trade_key,
        };
        let trade = match client.create_trade(&request, quote).await {
            Ok(trade) => trade,
            // A refusal of this request is not proof about an earlier one whose outcome was
            // unknown: a service that traded, answered late, then refuses the retry ("quote
            // expired" before it looks the key up) still holds that trade. The key decides.
            // Whether the earlier outcome was recorded does not matter: a process killed
            // between its send and that record (or an ops recheck, which resets the count)
            // leaves a TRADING fill whose count says 0 (the full chaos profile produces one).
            Err(error) if self.trade_effect(&error) == Effect::NotDone && send == Send::Again => {
                match client.trade_by_key(&fill.trade_key).await {
                    Ok(Some(record)) => {
                        tracing::warn!(
                            deposit_order_id = claim.id, trade_key = %fill.trade_key,
                            trade_id = %record.trade_id, refusal = %error,
                            "the retry was refused but the service holds a trade under the key: settling it"
                        );
                        crate::quote::Trade {
                            trade_id: record.trade_id,
                            rate: record.rate.unwrap_or(quote.rate),
                            fee: record.fee.unwrap_or(quote.fee),
                        }
                    }
                    Ok(None) => {
                        settle::release(&self.outbox, claim, fill, ReleaseReason::TradeRefused)
                            .await?;
                        return Err(error.into());
                    }
                    Err(lookup) => {
                        return Ok(AttemptEnd::InDoubt {
                            trade_key: fill.trade_key.clone(),
                            checks: fill.trade_checks.saturating_add(1),
                            error: format!(
                                "{}; looking the key up failed too: {}",
                                paybus_telemetry::one_line(&error),
                                paybus_telemetry::one_line(&lookup)
                            ),
                        });
                    }
                }
            }
            Err(error) if self.trade_effect(&error) == Effect::NotDone => {
                settle::release(&self.outbox, claim, fill, ReleaseReason::TradeRefused).await?;
                return Err(error.into());
            }
            Err(error) => {
                return Ok(AttemptEnd::InDoubt {
                    trade_key: fill.trade_key.clone(),
                    checks: fill.trade_checks.saturating_add(1),
                    error: paybus_telemetry::one_line(&error),
                });
            }
        };
        match settle::settle(
            &self.outbox,
            claim,
            fill,
            &trade,
            &self.clock,
            correlation_id,
        )
        .await?
        {
            Settled::Filled => Ok(AttemptEnd::Closed(deposit_order::CloseReason::Filled)),
            Settled::Partial { remaining } => Ok(AttemptEnd::NotFilled {
                remaining,
                why: format!("filled {} of it (partial-retry)", fill.total),
            }),
            Settled::ClaimLost => {
                // The trade exists but the order was taken over (its attempt looked dead). The
                // fill is still TRADING: the next attempt asks for the same key, gets this
                // trade back and settles it once.
                tracing::warn!(
                    deposit_order_id = claim.id,
                    trade_id = %trade.trade_id,
                    trade_key = %fill.trade_key,
                    "traded, but the claim was taken over before the settle; the next attempt \
                     settles this trade under the same key"
                );
                Ok(AttemptEnd::ClaimLost)
            }
        }
    }
}

/// A deposit order's name at the quote service.
fn reference(deposit_order_id: u64) -> String {
    format!("p2p-deposit-{deposit_order_id}")
}

/// Whether a createTrade under a fill's key may have gone out before this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    /// Sent right after the fill was marked TRADING in this attempt: nothing went out before.
    First,
    /// A TRADING fill found by this attempt: an earlier one marked it, and its send's outcome
    /// is unknown (recorded as a check or lost with a killed process).
    Again,
}
