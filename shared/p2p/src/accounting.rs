//! Outcome accounting (seed 000 §3.3 and §4 ③): after an attempt, in a transaction of its own,
//! re-read the order and judge the attempt by where the order *is*, not by whether the attempt
//! threw (principle 4).
//!
//! | the order, re-read | accounting |
//! | --- | --- |
//! | terminal (MATCHED, CANCELLED, EXPIRED) | done; the counter is not touched |
//! | still MATCHING under this attempt's claim — normal return or error alike | `match_attempt_count` + 1; below max → PENDING, `claimed_at` NULL, next attempt after the backoff; at max → CANCELLED `MATCH_FAILED` + dead letter |
//! | past `expires_at` | EXPIRED (a retry could not finish in time) |
//! | PENDING, or MATCHING under another claim | the claim was taken over (reaped): nothing is written |
//!
//! A separate transaction because an attempt that failed with an error rolled its own work
//! back: counting inside it would roll the count back too (seed 000 §4). The seed's legacy
//! path is why the result is re-read: it "returns normally" with the order still MATCHING, and
//! a counter fed by exceptions alone never sees it (§3.2). Reservations still held by the
//! attempt (it died between trade and settle) are released here, so none outlives it.

use std::time::Duration;

use paybus_money::Amount;
use paybus_platform::{
    bus::{Envelope, Outbox, dead_letter},
    retry::{Claim, Clock, RetryDecision, RetryPolicy, Settled},
};
use uuid::Uuid;

use crate::{
    FUNCTION, MatchError,
    deposit_order::{self, CloseReason, Closer, DEPOSIT_ORDERS, DepositOrderStatus, FinalFailure},
    matches::{self, Held, ReleaseReason},
    messages::DepositOrderCreated,
};

/// How an attempt ended, as the attempt saw it (accounting re-reads the order regardless).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The order reached a terminal state in this attempt.
    Closed(CloseReason),
    /// Returned normally without filling it: still MATCHING (partial-retry's remainder, no
    /// liquidity available, candidates busy).
    NotFilled { remaining: Amount, why: String },
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

/// The accounting transaction of one attempt.
#[tracing::instrument(skip_all, fields(deposit_order_id = claim.id))]
pub async fn account(
    outbox: &Outbox,
    claim: &Claim,
    attempt: &Result<AttemptEnd, MatchError>,
    retry: &RetryPolicy,
    clock: &Clock,
    dead_letters: DeadLetters,
    correlation_id: Uuid,
) -> Result<Accounted, MatchError> {
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
    if deposit_order::close_if_expired(&mut uow, &order, claim, clock, correlation_id).await? {
        uow.commit().await?;
        return Ok(Accounted::Terminal {
            status: DepositOrderStatus::Expired,
            reason: Some(CloseReason::Expired),
        });
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
                CloseReason::MatchFailed,
                Some(FinalFailure { error: &error }),
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
                if dead_letters == DeadLetters::Record {
                    let message = Envelope::with_correlation(
                        correlation_id,
                        DepositOrderCreated {
                            deposit_order_id: claim.id,
                        },
                    )
                    .to_outgoing()
                    .map_err(|e| MatchError::Outbox(e.into()))?;
                    dead_letter::record_unsent(&mut uow, FUNCTION, &message, &reason, failures)
                        .await?;
                }
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

/// The attempt's result as a `last_error` line.
fn describe(attempt: &Result<AttemptEnd, MatchError>, remaining: Amount, amount: Amount) -> String {
    match attempt {
        Err(error) => paybus_platform::telemetry::one_line(error),
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
    }
}
