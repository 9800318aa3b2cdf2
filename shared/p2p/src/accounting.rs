//! Outcome accounting (seed 000 §3.3 and §4 ③, principle 4): after an attempt, its own
//! transaction re-reads the order and judges the attempt by where the order *is*:
//!
//! | the order, re-read | accounting |
//! | --- | --- |
//! | terminal (MATCHED, CANCELLED, EXPIRED) | done; the counter is not touched |
//! | still MATCHING under this attempt's claim — normal return or error alike | `match_attempt_count` + 1; below max → PENDING, `claimed_at` NULL, next attempt after the backoff; at max → CANCELLED `MATCH_FAILED` + dead letter |
//! | still MATCHING, a fill's createTrade outcome unknown (in doubt) | **not counted, not expired, its TRADING matches kept**: the fill's `trade_checks` + 1; below `PAYBUS_MATCH_TRADE_CHECKS` → PENDING after the check backoff (the next attempt asks again under the same key first); at the bound → IN_DOUBT + dead letter (needs a human) |
//! | still MATCHING, only other matchers' locks kept it from filling (contended) | not counted: PENDING again in a moment (bounded by the order's expiry) |
//! | past `expires_at` | EXPIRED (a retry could not finish in time) |
//! | PENDING, or MATCHING under another claim | the claim was taken over (reaped): nothing is written |
//!
//! Re-read, because the seed's legacy path "returns normally" with the order still MATCHING,
//! unseen by a counter fed by exceptions (§3.2); apart, as a failed attempt's rollback would
//! undo a count made inside it (§4).

use std::time::Duration;

use chrono::{DateTime, Utc};

use paybus_bus::{Envelope, Outbox, dead_letter};
use paybus_money::Amount;
use paybus_retry::{Claim, Clock, RetryDecision, RetryPolicy, Settled};
use uuid::Uuid;

use crate::{
    FUNCTION, MatchError,
    deposit_order::{self, Close, CloseReason, Closer, DEPOSIT_ORDERS, DepositOrderStatus},
    matches::{self, Held, ReleaseReason},
    messages::DepositOrderCreated,
};

/// How long an order whose candidates were all held by other matchers waits before it looks
/// again (not a failure: "it looks again shortly").
pub const CONTENDED_PAUSE: Duration = Duration::from_secs(2);

/// How an attempt ended, as the attempt saw it (accounting re-reads the order regardless).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The order reached a terminal state in this attempt.
    Closed(CloseReason),
    /// Returned normally without filling it: still MATCHING (partial-retry's remainder, no
    /// liquidity available).
    NotFilled { remaining: Amount, why: String },
    /// Fill-or-cancel came up short only because other matchers held the candidates: not a
    /// failed attempt.
    Contended { remaining: Amount },
    /// createTrade's outcome for the fill `trade_key` is unknown (its matches stay TRADING);
    /// `checks` counts the calls under that key that ended so, this one included.
    InDoubt {
        trade_key: String,
        checks: u32,
        error: String,
    },
    /// The claim was taken over mid-attempt: nothing more is ours to write.
    ClaimLost,
}

/// What accounting decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accounted {
    /// Terminal: nothing to count.
    Terminal {
        status: DepositOrderStatus,
        reason: Option<CloseReason>,
    },
    /// Counted; PENDING again, due after `after`.
    Retry {
        after: Duration,
        failures: u32,
        error: String,
    },
    /// Counted at the limit: CANCELLED MATCH_FAILED (and its dead letter).
    GaveUp { failures: u32, error: String },
    /// Not counted: PENDING again after `after` (contention).
    Deferred { after: Duration, error: String },
    /// A fill in doubt: PENDING again after the check backoff (`after`), or, at the bound
    /// (`after` `None`), IN_DOUBT with its dead letter.
    InDoubt {
        checks: u32,
        after: Option<Duration>,
        error: String,
    },
    /// Someone else owns the order now (or it is gone): nothing was written.
    ClaimLost { status: Option<DepositOrderStatus> },
}

/// Where a give-up's dead letter comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetters {
    /// The attempt came from a message: the handler answers `Failed` and the consumer runtime
    /// dead-letters that message.
    ByTheRuntime,
    /// No message carried it (the due-orders job, an inline attempt in the API): the dead
    /// letter is recorded in the accounting transaction itself.
    Record,
}

/// The policies accounting applies: failed attempts, and the checks of a fill in doubt.
#[derive(Debug, Clone, Copy)]
pub struct Policies<'a> {
    pub attempts: &'a RetryPolicy,
    pub trade_checks: &'a RetryPolicy,
}

impl DeadLetters {
    /// The dead letter of an order given up on (or parked for a human), in the accounting
    /// transaction, when no message carries the attempt; nothing when the runtime will
    /// dead-letter the message that does.
    async fn record(
        self,
        conn: &mut sqlx::MySqlConnection,
        deposit_order_id: u64,
        correlation_id: Uuid,
        reason: &str,
        attempts: u32,
    ) -> Result<(), MatchError> {
        if self == DeadLetters::ByTheRuntime {
            return Ok(());
        }
        let message =
            Envelope::with_correlation(correlation_id, DepositOrderCreated { deposit_order_id })
                .to_outgoing()
                .map_err(|e| MatchError::Outbox(e.into()))?;
        dead_letter::record_unsent(conn, FUNCTION, &message, reason, attempts).await?;
        Ok(())
    }
}

/// The accounting transaction of one attempt. Reservations the attempt still held (it died
/// between trade and settle) are released here, so none outlives it.
#[tracing::instrument(skip_all, fields(deposit_order_id = claim.id))]
pub async fn account(
    outbox: &Outbox,
    claim: &Claim,
    attempt: &Result<AttemptEnd, MatchError>,
    policies: Policies<'_>,
    clock: &Clock,
    dead_letters: DeadLetters,
    correlation_id: Uuid,
) -> Result<Accounted, MatchError> {
    let retry = policies.attempts;
    let mut uow = outbox.begin_read_committed().await?;
    let Some(order) = deposit_order::lock(&mut uow, claim.id).await? else {
        uow.rollback().await?;
        return Ok(Accounted::ClaimLost { status: None });
    };
    if order.status.is_terminal() {
        uow.rollback().await?;
        return Ok(Accounted::Terminal {
            status: order.status,
            reason: order.close_reason,
        });
    }
    if !order.is_held_by(claim) {
        uow.rollback().await?;
        return Ok(Accounted::ClaimLost {
            status: Some(order.status),
        });
    }
    // In doubt: never closed, never counted — whatever its expiry says (a trade may exist).
    if let Ok(AttemptEnd::InDoubt {
        trade_key,
        checks,
        error,
    }) = attempt
    {
        let accounted = in_doubt(
            &mut uow,
            claim,
            &order,
            InDoubtFill {
                trade_key,
                checks: *checks,
                error,
            },
            policies.trade_checks,
            clock,
            dead_letters,
            correlation_id,
        )
        .await?;
        uow.commit().await?;
        return Ok(accounted);
    }
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT COALESCE(?, NOW(6))")
        .bind(clock.sql_now())
        .fetch_one(&mut *uow)
        .await?;
    if deposit_order::close_if_expired(&mut uow, &order, now, claim, clock, correlation_id).await? {
        uow.commit().await?;
        return Ok(Accounted::Terminal {
            status: DepositOrderStatus::Expired,
            reason: Some(CloseReason::Expired),
        });
    }
    if let Ok(AttemptEnd::Contended { remaining }) = attempt {
        let error = format!(
            "not filled: {remaining} of {} remaining (the candidates were held by other \
             matchers; looking again in {CONTENDED_PAUSE:?}, not counted)",
            order.amount
        );
        let accounted = match DEPOSIT_ORDERS
            .defer(&mut uow, claim, CONTENDED_PAUSE, Some(&error), clock)
            .await?
        {
            Settled::Yes => Accounted::Deferred {
                after: CONTENDED_PAUSE,
                error,
            },
            Settled::ClaimLost => Accounted::ClaimLost {
                status: Some(order.status),
            },
        };
        uow.commit().await?;
        return Ok(accounted);
    }

    let failures = claim.attempts.saturating_add(1);
    let max = retry.max_attempts();
    let error = format!(
        "attempt {failures}/{max}: {}",
        describe(attempt, order.remaining_amount, order.amount)
    );
    matches::release(
        &mut uow,
        Held::OfOrders(&[claim.id]),
        ReleaseReason::AttemptEnded,
    )
    .await?;
    let accounted = match retry.after_failure(failures) {
        RetryDecision::RetryAfter(after) => {
            match DEPOSIT_ORDERS
                .settle_retry(&mut uow, claim, after, &error, clock)
                .await?
            {
                Settled::Yes => Accounted::Retry {
                    after,
                    failures,
                    error,
                },
                Settled::ClaimLost => Accounted::ClaimLost {
                    status: Some(order.status),
                },
            }
        }
        RetryDecision::GiveUp => {
            let closed = deposit_order::close(
                &mut uow,
                claim.id,
                Closer::Claim(claim),
                Close::MatchFailed { error: &error },
                clock,
                correlation_id,
            )
            .await?;
            if !closed {
                Accounted::ClaimLost {
                    status: Some(order.status),
                }
            } else {
                let reason = format!(
                    "deposit order {}: gave up after {failures} attempts; last: {error}",
                    claim.id
                );
                dead_letters
                    .record(&mut uow, claim.id, correlation_id, &reason, failures)
                    .await?;
                Accounted::GaveUp {
                    failures,
                    error: reason,
                }
            }
        }
    };
    uow.commit().await?;
    match &accounted {
        Accounted::Retry { after, error, .. } => {
            tracing::info!(deposit_order_id = claim.id, failures, ?after, %error, "not matched; retry later");
        }
        Accounted::GaveUp { error, .. } => {
            tracing::warn!(deposit_order_id = claim.id, failures, %error, "not matched; given up (MATCH_FAILED)");
        }
        _ => {}
    }
    Ok(accounted)
}

/// A fill whose createTrade outcome is unknown, as the attempt left it.
struct InDoubtFill<'a> {
    trade_key: &'a str,
    checks: u32,
    error: &'a str,
}

/// Accounting of an attempt that left a fill in doubt, in `uow` (which holds the order under
/// `claim`): the fill's check count and error, then PENDING after the check backoff, or at the
/// bound IN_DOUBT with its dead letter. Nothing is released but RESERVED leftovers.
#[allow(clippy::too_many_arguments)]
async fn in_doubt(
    uow: &mut paybus_bus::UnitOfWork<'_>,
    claim: &Claim,
    order: &deposit_order::DepositOrder,
    fill: InDoubtFill<'_>,
    checks_policy: &RetryPolicy,
    clock: &Clock,
    dead_letters: DeadLetters,
    correlation_id: Uuid,
) -> Result<Accounted, MatchError> {
    let InDoubtFill {
        trade_key,
        checks,
        error: call_error,
    } = fill;
    let max = checks_policy.max_attempts();
    matches::release(
        uow,
        Held::OfOrders(&[claim.id]),
        ReleaseReason::AttemptEnded,
    )
    .await?;
    matches::note_unknown_outcome(uow, claim.id, trade_key, checks, call_error).await?;
    let accounted = match checks_policy.after_failure(checks) {
        RetryDecision::RetryAfter(after) => {
            let error = format!(
                "trade in doubt under key {trade_key} (check {checks}/{max}, asking again in \
                 {after:?}): {call_error}"
            );
            match DEPOSIT_ORDERS
                .defer(uow, claim, after, Some(&error), clock)
                .await?
            {
                Settled::Yes => Accounted::InDoubt {
                    checks,
                    after: Some(after),
                    error,
                },
                Settled::ClaimLost => Accounted::ClaimLost {
                    status: Some(order.status),
                },
            }
        }
        RetryDecision::GiveUp => {
            let error = format!(
                "deposit order {}: createTrade's outcome stayed unknown after {checks} calls \
                 under key {trade_key}: a trade may exist at the quote service; last: \
                 {call_error}",
                claim.id
            );
            if !deposit_order::hold_in_doubt(uow, claim, &error).await? {
                return Ok(Accounted::ClaimLost {
                    status: Some(order.status),
                });
            }
            dead_letters
                .record(uow, claim.id, correlation_id, &error, checks)
                .await?;
            Accounted::InDoubt {
                checks,
                after: None,
                error,
            }
        }
    };
    match &accounted {
        Accounted::InDoubt {
            after: Some(after), ..
        } => tracing::warn!(
            deposit_order_id = claim.id,
            trade_key,
            checks,
            ?after,
            error = call_error,
            "createTrade's outcome is unknown: the fill stays held; asking again under the same key"
        ),
        Accounted::InDoubt { error, .. } => tracing::error!(
            deposit_order_id = claim.id, trade_key, checks, %error,
            "trade in doubt: asking stopped; IN_DOUBT with a dead letter for a human"
        ),
        _ => {}
    }
    Ok(accounted)
}

/// The attempt's result as a `last_error` line.
fn describe(attempt: &Result<AttemptEnd, MatchError>, remaining: Amount, amount: Amount) -> String {
    match attempt {
        Err(error) => paybus_telemetry::one_line(error),
        Ok(AttemptEnd::NotFilled { why, .. }) => {
            format!("not filled: {remaining} of {amount} remaining ({why})")
        }
        // The attempt said it was done but the order is still MATCHING under its claim: the
        // seed's "returned normally" case; the row, not the return value, decides.
        Ok(AttemptEnd::Closed(reason)) => format!(
            "the attempt reported {reason} but the order is still MATCHING ({remaining} of \
             {amount} remaining)"
        ),
        Ok(AttemptEnd::ClaimLost) => {
            format!("not filled: {remaining} of {amount} remaining (claim reported lost)")
        }
        // Both are accounted before a failure is described.
        Ok(AttemptEnd::Contended { .. } | AttemptEnd::InDoubt { .. }) => {
            format!("not filled: {remaining} of {amount} remaining")
        }
    }
}
