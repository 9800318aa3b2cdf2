//! The deliver-webhook function (docs/webhooks.md): `partner.notification.created` → one signed
//! POST of the notification to its partner, after the transition that owes it committed
//! (principle 8), retried with backoff recorded on the row and given up at a limit (principle 9).
//! It offers [`DeliverWebhook`] (the handler; its jobs [`due_notifications`] and [`prune`]),
//! [`request`] (the POST and how its answer is judged) and [`bulkhead`] (partner isolation).
//!
//! One message, three steps, no transaction or lock held across the POST (principle 3): a
//! **claim** (a conditional UPDATE that counts the attempt and leases the row, so a duplicate is
//! `Skipped` while the POST is in flight), the **POST**, and a **settle** conditional on that
//! claim (2xx DELIVERED; 410 parks the row and disables the endpoint; else retry or FAILED).
//! These are the retry kit on `paybus_partners::notifications::NOTIFICATIONS`.
//!
//! The POST's unknown outcome (a timeout or reset after the request was written) is handled as
//! a failure, because the contract with partners is at least once: the same notification goes
//! again under the same `webhook-id`, which partners deduplicate on (principle 12).

pub mod bulkhead;
pub mod config;
pub mod prune;
pub mod request;
mod triage;

use std::sync::Arc;

use std::time::Duration;

use paybus_bus::{Context, Envelope, Handler, HandlerError, Outcome, Services, metrics};
use paybus_config::{
    Setting,
    sealed::{self, Sealer},
    setting::SettingGroup,
};
use paybus_maintenance::{DueSweep, DueSweepConfig, Job};
use paybus_partners::{
    attempts::NewAttempt,
    breaker::{self, BreakerState},
    notifications::{self, ClaimedNotification, DeliveryClaim, NOTIFICATIONS, NotificationCreated},
};
use paybus_retry::{AfterFailure, Clock, RowState, Settled};
use paybus_runtime::function::{BuildError, Function};
use sqlx::MySqlPool;

use bulkhead::Bulkhead;

pub use config::WebhookConfig;
pub use request::Attempt;

/// What a partner's breaker makes of a claimed delivery.
enum Gate {
    /// Attempt it (`probe`: it is the half-open breaker's one probe).
    Pass { probe: bool },
    /// Not attempted: parked, with this outcome.
    Park(Outcome),
}

/// How long a delivery deferred at its partner's in-flight bound waits before it is due again
/// (the due sweep brings it back).
const DEFERRED_FOR: Duration = Duration::from_secs(1);

/// When a delivery a process without `PAYBUS_SECRETS_KEY` left alone comes back: the row is
/// untouched (due, its message stamped), so the due sweep re-publishes it once the stamp is
/// older than the sweep's `stale_after` (default 5 min).
const NO_KEY_RETRY: Duration = Duration::from_secs(5 * 60);

/// How long a delivery to a disabled (410) endpoint is parked before the due sweep brings it
/// back to be parked again: re-enabling makes it due at once, so this only bounds the cost of
/// looking (one message an hour per parked notification).
pub const PARKED_WHILE_DISABLED: Duration = Duration::from_secs(60 * 60);

/// The handler. Build it once at start-up (it owns the HTTP client and its connection pool).
#[derive(Clone)]
pub struct DeliverWebhook {
    http: reqwest::Client,
    config: WebhookConfig,
    clock: Clock,
    bulkhead: Bulkhead,
    /// Opens the partners' sealed webhook secrets. None (`PAYBUS_SECRETS_KEY` unset): every
    /// delivery is parked unattempted, nothing is lost, until a process with the key runs.
    sealer: Option<Sealer>,
}

impl DeliverWebhook {
    /// Builds the HTTP client (timeouts, TLS, no redirects).
    pub fn new(config: WebhookConfig, sealer: Sealer) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: request::client(&config)?,
            bulkhead: Bulkhead::new(config.partner_concurrency),
            config,
            clock: Clock::Database,
            sealer: Some(sealer),
        })
    }

    /// Without `PAYBUS_SECRETS_KEY`: deliveries are parked, none is sent unsigned or failed.
    fn without_key(config: WebhookConfig) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: request::client(&config)?,
            bulkhead: Bulkhead::new(config.partner_concurrency),
            config,
            clock: Clock::Database,
            sealer: None,
        })
    }

    /// The same handler on another clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &WebhookConfig {
        &self.config
    }
}

impl Handler for DeliverWebhook {
    type Message = NotificationCreated;
    const FUNCTION: &'static str = "deliver-webhook";

    async fn handle(
        &self,
        message: Envelope<NotificationCreated>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let id = message.data.notification_id;
        let pool = ctx.db.pool();
        let Some(sealer) = &self.sealer else {
            // Nothing to sign with: the row waits unclaimed, no attempt counted.
            tracing::error!(
                notification_id = id,
                "PAYBUS_SECRETS_KEY is not set: cannot sign, the delivery waits"
            );
            metrics::record(Self::FUNCTION, "no_secrets_key", Duration::ZERO);
            return Ok(Outcome::Retry {
                after: NO_KEY_RETRY,
                error: format!(
                    "notification {id}: PAYBUS_SECRETS_KEY is not set, nothing can sign; not \
                     attempted"
                ),
            });
        };
        let mut claimed =
            match notifications::claim(pool, sealer, id, self.config.lease(), &self.clock).await? {
                DeliveryClaim::Claimed(claimed) => claimed,
                DeliveryClaim::SkippedNoWebhook { partner_id } => {
                    return Ok(Outcome::Skipped(format!(
                        "notification {id}: partner {partner_id} has no webhook_url; marked SKIPPED"
                    )));
                }
                DeliveryClaim::NotClaimed(state) => {
                    return Ok(not_claimed(id, &state, ctx.attempt));
                }
                DeliveryClaim::Missing => {
                    return Ok(Outcome::Failed(format!("notification {id} does not exist")));
                }
            };

        if claimed.disabled {
            let delay = PARKED_WHILE_DISABLED;
            notifications::defer(pool, &claimed, delay, &self.clock).await?;
            metrics::record(Self::FUNCTION, "parked", Duration::ZERO);
            return Ok(Outcome::Skipped(format!(
                "notification {id}: partner {}'s endpoint is disabled (it answered 410 Gone); \
                 parked {delay:?} until its URL is set again, no attempt counted",
                claimed.partner_id
            )));
        }
        let secrets = match &claimed.secrets {
            Ok(secrets) => secrets.clone(),
            Err(error) => {
                // Not the partner's fault: no POST, nothing on its breaker; retried (an old key
                // put back into PAYBUS_SECRETS_OLD_KEYS opens it), FAILED at the limit.
                let error = format!("cannot sign: {error}");
                return self.failed(pool, &claimed, &error, None).await;
            }
        };

        // Partners are isolated: an open breaker parks the delivery, a partner at its
        // in-flight bound defers it; neither is an attempt, and the prefetch slot is free at
        // once for other partners' deliveries.
        let probe = match self.breaker_gate(pool, &claimed).await? {
            Gate::Park(outcome) => return Ok(outcome),
            Gate::Pass { probe } => probe,
        };
        let Some(slot) = self
            .bulkhead
            .enter(claimed.partner_id, self.config.partner_wait)
            .await
        else {
            let delay = DEFERRED_FOR;
            notifications::defer(pool, &claimed, delay, &self.clock).await?;
            metrics::record(Self::FUNCTION, "deferred", Duration::ZERO);
            return Ok(Outcome::Skipped(format!(
                "notification {id}: partner {} has {} deliveries in flight; deferred {delay:?}, \
                 no attempt counted",
                claimed.partner_id,
                self.bulkhead.limit()
            )));
        };
        if !probe && (slot.waited || claimed.breaker.failures > 0) {
            // Between the claim's read and the slot, the deliveries ahead of this one may have
            // opened a failing partner's breaker: look again rather than add one more failure.
            let mut conn = pool.acquire().await?;
            if let Some(now) = breaker::read(&mut conn, claimed.partner_id, &self.clock).await? {
                claimed.breaker = now;
            }
            drop(conn);
            if let Gate::Park(outcome) = self.breaker_gate(pool, &claimed).await? {
                return Ok(outcome);
            }
        }

        // No transaction is open here: the claim committed, the lease keeps others off.
        let started_at = chrono::Utc::now();
        let started = tokio::time::Instant::now();
        let attempt = request::post(
            &self.http,
            self.config.timeout,
            &claimed,
            &secrets,
            started_at.timestamp(),
        )
        .await;
        let record = NewAttempt {
            started_at,
            status_code: attempt.status(),
            latency: started.elapsed(),
            error: attempt.error().map(str::to_owned),
        };
        self.record_on_breaker(pool, &claimed, &attempt).await?;

        match attempt {
            Attempt::Delivered { status } => {
                match notifications::settle_delivered(pool, &claimed, &record).await? {
                    Settled::Yes => Ok(Outcome::Done),
                    Settled::ClaimLost => Ok(claim_lost(&claimed, &format!("HTTP {status}"))),
                }
            }
            Attempt::Gone(error) => {
                let reason = "HTTP 410 Gone from the endpoint";
                let (settled, disabled) = notifications::settle_gone(
                    pool,
                    &claimed,
                    &record,
                    reason,
                    PARKED_WHILE_DISABLED,
                    &self.clock,
                )
                .await?;
                if disabled {
                    tracing::warn!(
                        partner_id = claimed.partner_id,
                        notification_id = id,
                        "partner endpoint answered 410 Gone: disabled, its deliveries are \
                         parked until its webhook URL is set again"
                    );
                    metrics::record(Self::FUNCTION, "endpoint_disabled", Duration::ZERO);
                }
                Ok(match settled {
                    Settled::Yes => Outcome::Skipped(format!(
                        "notification {id}: partner {}'s endpoint answered 410 Gone; disabled, \
                         parked until its URL is set again",
                        claimed.partner_id
                    )),
                    Settled::ClaimLost => claim_lost(&claimed, &error),
                })
            }
            Attempt::Failed { error, .. } => {
                self.failed(pool, &claimed, &error, Some(&record)).await
            }
        }
    }
}

impl DeliverWebhook {
    /// Settles a failed attempt (`record`: the POST made, if one was): PENDING after the
    /// backoff, or FAILED at the limit.
    async fn failed(
        &self,
        pool: &MySqlPool,
        claimed: &ClaimedNotification,
        error: &str,
        record: Option<&NewAttempt>,
    ) -> Result<Outcome, HandlerError> {
        let (id, n) = (claimed.id, claimed.attempts);
        let max = self.config.retry.max_attempts();
        let settled = notifications::settle_failure(
            pool,
            claimed,
            &self.config.retry,
            error,
            &self.clock,
            record,
        )
        .await?;
        Ok(match settled {
            AfterFailure::Retry { after, .. } => Outcome::Retry {
                after,
                error: format!("notification {id}, attempt {n}/{max}: {error}"),
            },
            AfterFailure::Failed { .. } => Outcome::Failed(format!(
                "notification {id} to partner {}: gave up after {n} attempts; last error: {error}",
                claimed.partner_id
            )),
            AfterFailure::ClaimLost => claim_lost(claimed, error),
        })
    }

    /// Whether the partner's breaker lets this delivery through: closed, or half-open with
    /// this delivery as the probe. Otherwise (open, or the probe taken by another delivery)
    /// it is parked until the breaker may let a probe through, with no attempt counted.
    async fn breaker_gate(
        &self,
        pool: &MySqlPool,
        claimed: &ClaimedNotification,
    ) -> Result<Gate, HandlerError> {
        let (id, partner_id) = (claimed.id, claimed.partner_id);
        let parked_for = match claimed.breaker.state() {
            BreakerState::Closed => return Ok(Gate::Pass { probe: false }),
            BreakerState::Open => claimed.breaker.remaining(),
            BreakerState::HalfOpen => {
                let mut conn = pool.acquire().await?;
                if breaker::take_probe(&mut conn, partner_id, &self.config.breaker, &self.clock)
                    .await?
                {
                    tracing::info!(
                        partner_id,
                        notification_id = id,
                        "partner circuit half-open: probing"
                    );
                    return Ok(Gate::Pass { probe: true });
                }
                self.config.breaker.cool_down
            }
        };
        notifications::defer(pool, claimed, parked_for, &self.clock).await?;
        metrics::record(Self::FUNCTION, "parked", Duration::ZERO);
        Ok(Gate::Park(Outcome::Skipped(format!(
            "notification {id}: partner {partner_id}'s circuit is open; parked {parked_for:?}, \
             no attempt counted"
        ))))
    }

    /// Counts the POST's result on the partner's breaker (logs and a metric when it opens or
    /// closes).
    async fn record_on_breaker(
        &self,
        pool: &MySqlPool,
        claimed: &ClaimedNotification,
        attempt: &Attempt,
    ) -> Result<(), HandlerError> {
        let partner_id = claimed.partner_id;
        match attempt {
            // Nothing to reset on a healthy partner: no statement at all.
            Attempt::Delivered { .. }
                if claimed.breaker.failures == 0 && claimed.breaker.open_until.is_none() => {}
            Attempt::Delivered { .. } => {
                let mut conn = pool.acquire().await?;
                if breaker::record_success(&mut conn, partner_id).await? {
                    tracing::info!(partner_id, "partner circuit closed: delivered again");
                    metrics::record(Self::FUNCTION, "breaker_closed", Duration::ZERO);
                }
            }
            // A 410 disables the endpoint instead; the breaker is for endpoints that may heal.
            Attempt::Gone(_) => {}
            Attempt::Failed { error, .. } => {
                let mut conn = pool.acquire().await?;
                if breaker::record_failure(&mut conn, partner_id, &self.config.breaker, &self.clock)
                    .await?
                {
                    tracing::warn!(
                        partner_id,
                        failures = self.config.breaker.failures_to_open,
                        cool_down = ?self.config.breaker.cool_down,
                        last_error = %error,
                        "partner circuit opened: its deliveries are parked"
                    );
                    metrics::record(Self::FUNCTION, "breaker_opened", Duration::ZERO);
                }
            }
        }
        Ok(())
    }
}

impl Function for DeliverWebhook {
    /// Opens the partners' sealed webhook secrets to sign.
    const SECRETS: &'static [Setting] = &[sealed::VAR_SECRETS_KEY];

    const SETTINGS: Option<SettingGroup> = Some(SettingGroup {
        title: "Partner webhooks: deliver-webhook",
        read_by: "Read by deliver-webhook (`paybus_deliver_webhook::config`), which delivers \
                  the notifications of p2p and confirmations.",
        settings: config::SETTINGS,
    });

    /// Without `PAYBUS_SECRETS_KEY` it starts (every catalog function starts in `paybus run`
    /// and the sweeper) but says so at ERROR and sends nothing: each delivery is retried
    /// unclaimed, no attempt counted (the `no_secrets_key` outcome counts them).
    fn build(services: &Services) -> Result<Self, BuildError> {
        let vars = &services.settings.vars;
        let config = WebhookConfig::read(vars)?;
        let sealer = Sealer::read(
            vars.secret(sealed::VAR_SECRETS_KEY, sealed::KEY_MIN_CHARS)?,
            vars,
        )?;
        let built = match sealer {
            Some(sealer) => DeliverWebhook::new(config, sealer),
            None => {
                tracing::error!(
                    "PAYBUS_SECRETS_KEY is not set: deliver-webhook cannot sign, so it sends \
                     nothing; its deliveries wait until it is set"
                );
                DeliverWebhook::without_key(config)
            }
        };
        built.map_err(|source| BuildError::Client {
            what: "the webhook HTTP client",
            source: source.into(),
        })
    }

    /// The due-retries sweep: re-publishes partner notifications whose retry is due (and
    /// deliveries whose process died, once their lease runs out),
    /// and the pruning of old delivery attempt records.
    fn jobs(services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
        Ok(vec![
            Arc::new(due_notifications(services, DueSweepConfig::default())),
            Arc::new(prune::PruneAttempts::new(
                services.pool.clone(),
                prune::PruneConfig::default(),
            )),
        ])
    }

    const WORK_TABLES: &'static [&'static paybus_retry::WorkTable] = &[&NOTIFICATIONS];

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: NotificationCreated,
    ) -> Result<paybus_ops::triage::Triage, paybus_ops::triage::TriageError> {
        triage::triage(conn, message).await
    }

    async fn prepare_replay(
        conn: &mut sqlx::MySqlConnection,
        message: NotificationCreated,
    ) -> Result<(), paybus_ops::triage::TriageError> {
        triage::prepare_replay(conn, message).await
    }
}

/// The due sweep over `partner_notifications`, as deliver-webhook's job runs it.
pub fn due_notifications(
    services: &Services,
    config: DueSweepConfig,
) -> DueSweep<NotificationCreated> {
    DueSweep::new(
        "due-notifications",
        &NOTIFICATIONS,
        |notification_id| NotificationCreated { notification_id },
        services.outbox.clone(),
        config,
    )
}

/// Why a message found nothing to send.
fn not_claimed(id: u64, state: &RowState, delivery_attempt: u32) -> Outcome {
    match state.status.as_str() {
        // A redelivery of a message that failed the row: its dead letter may not have been
        // confirmed (broker trouble), so it is failed again. The dead letter's id is derived
        // from the message id, so a dead letter that did get through is still recorded once.
        // A first delivery (a late duplicate) is only skipped: the row has its dead letter.
        "FAILED" if delivery_attempt > 1 => Outcome::Failed(format!(
            "notification {id} is FAILED after {} attempts; last error: {}",
            state.attempts,
            state.last_error.as_deref().unwrap_or("none recorded")
        )),
        "PENDING" => match state.next_attempt_at {
            Some(at) if at > state.now => Outcome::Skipped(format!(
                "notification {id} is in flight or not due (attempt {} holds it until {})",
                state.attempts,
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            )),
            _ => Outcome::Skipped(format!(
                "notification {id} was claimed concurrently (attempt {})",
                state.attempts
            )),
        },
        status => Outcome::Skipped(format!("notification {id} is already {status}")),
    }
}

/// The settle found another attempt's claim in place (our lease ran out mid-request): that
/// attempt owns the row now, so this one writes nothing.
fn claim_lost(claimed: &ClaimedNotification, result: &str) -> Outcome {
    tracing::warn!(
        notification_id = claimed.id,
        attempt = claimed.attempts,
        result,
        "the claim ran out before the settle; another attempt owns the row"
    );
    Outcome::Skipped(format!(
        "notification {}: attempt {} ended ({result}) after its claim had been taken over",
        claimed.id, claimed.attempts
    ))
}
