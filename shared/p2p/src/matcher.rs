//! The matching attempt — the one used by the create API (async matching off: inline, in the
//! request), by match-deposit's handler (a message) and by its due-orders job (a batch claim)
//! — and its outcome accounting.
//!
//! ```text
//!  claim (committed) ─► reserve (short tx) ─► quote service: getQuote + createTrade ─► settle (short tx)
//!                           │                  no transaction open, no row locked      or release (short tx)
//!                           └ fill-or-cancel short: CANCELLED, no call                   │
//!                                                                                         ▼
//!                                          outcome accounting (its own tx): re-read, count, retry or give up
//! ```
//!
//! Every transaction here runs READ COMMITTED: each decision is a locking read or a guarded
//! UPDATE, and no gap lock stalls a concurrent reserve that inserts its matches.

use std::time::Duration;

use paybus_platform::{
    bus::{Envelope, Outbox},
    retry::{Claim, Clock},
};
use uuid::Uuid;

use crate::{
    CreateError, MatchError,
    accounting::{self, Accounted, AttemptEnd, DeadLetters},
    config::MatchingConfig,
    deposit_order::{self, Inserted, NewDepositOrder},
    matches::ReleaseReason,
    messages::DepositOrderCreated,
    quote::{QuoteClient, QuoteError, TradeRequest},
    reserve::{self, Reservation},
    settle::{self, Settled},
};

/// How often a fill-or-cancel attempt looks again when only other matchers' locks kept it
/// from filling, and the first pause (doubling).
const CONTENDED_TRIES: u32 = 5;
const CONTENDED_PAUSE: Duration = Duration::from_millis(10);

/// How the create API hands a new order to matching (`PAYBUS_ASYNC_MATCHING_ENABLED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// Switch off (the default, seed 000 §0): claimed in the inserting transaction and matched
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

/// Matches deposit orders. Build it once per process (it owns the quote service client).
#[derive(Clone)]
pub struct Matcher {
    outbox: Outbox,
    quote: Option<QuoteClient>,
    config: MatchingConfig,
    clock: Clock,
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matcher")
            .field("quote", &self.quote)
            .field("config", &self.config)
            .field("clock", &self.clock)
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
        })
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
        let mut uow = self.outbox.begin().await?;
        let id =
            match deposit_order::insert(&mut uow, new, self.config.order_ttl, &self.clock).await? {
                Inserted::Existing(id) => {
                    uow.rollback().await?;
                    return Ok(Created::Existing(id));
                }
                Inserted::New(id) => id,
            };
        tracing::Span::current().record("deposit_order_id", id);
        match handoff {
            Handoff::Queued => {
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
                // Claimed before anyone can see it PENDING: the due-orders job never races the
                // request for it, and if this process dies the reaper hands it back.
                let claim = deposit_order::claim(&mut uow, id, &self.clock)
                    .await?
                    .ok_or_else(|| {
                        MatchError::inconsistent(format!("new deposit order {id} not claimable"))
                    })?;
                uow.commit().await?;
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
        if let Err(error) = &attempt {
            tracing::warn!(
                deposit_order_id = claim.id,
                error = %paybus_platform::telemetry::one_line(error),
                "matching attempt failed"
            );
        }
        accounting::account(
            &self.outbox,
            claim,
            &attempt,
            &self.config.retry,
            &self.clock,
            dead_letters,
            correlation_id,
        )
        .await
    }

    /// The attempt itself: reserve, trade (no lock held), settle or release.
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
            match reserve::reserve(
                &self.outbox,
                claim,
                self.config.fill_policy,
                &self.clock,
                correlation_id,
            )
            .await?
            {
                Reservation::Held(fill) => break fill,
                Reservation::Closed(reason) => return Ok(AttemptEnd::Closed(reason)),
                Reservation::ClaimLost => return Ok(AttemptEnd::ClaimLost),
                Reservation::NothingAvailable { remaining } => {
                    return Ok(AttemptEnd::NotFilled {
                        remaining,
                        why: "no liquidity available".to_owned(),
                    });
                }
                Reservation::Contended { remaining } if tries >= CONTENDED_TRIES => {
                    return Ok(AttemptEnd::NotFilled {
                        remaining,
                        why: "the candidates were held by other matchers".to_owned(),
                    });
                }
                Reservation::Contended { .. } => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        };

        // No transaction is open here: the reservation committed, the claim keeps others off.
        let request = TradeRequest {
            currency: &fill.currency,
            amount: fill.total,
            reference: format!("p2p-deposit-{}", claim.id),
            key: &fill.trade_key,
        };
        let (quote, trade) = match quote.trade(&request).await {
            Ok(traded) => traded,
            Err(error) => {
                settle::release(&self.outbox, claim, &fill, ReleaseReason::QuoteFailed).await?;
                return Err(error.into());
            }
        };
        match settle::settle(
            &self.outbox,
            claim,
            &fill,
            &quote,
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
                // The trade exists but the order was taken over. The next attempt on this fill
                // asks for the same key and gets this trade back, so it is settled once.
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
