//! The confirm-withdrawal function (SPEC W2, seed 001): `withdrawal.tx_confirmed
//! {withdrawal_id, tx_hash}` moves an in-flight withdrawal to CONFIRMED exactly once.
//!
//! This is the incident the product exists to prevent (seed 001 §1): a chain monitor re-sent a
//! confirmation while the first was still in flight, both transactions read BROADCASTING from
//! their REPEATABLE READ snapshots, and the partner was debited and notified twice. Here the
//! transition is decided by a conditional UPDATE's affected rows ([`confirm_if_in_flight`]),
//! and the ledger's `WDR_CONFIRM:{id}` key stands behind it as the last line of defence.
//!
//! | delivery | outcome |
//! | --- | --- |
//! | this delivery made the transition | `Done`: CONFIRMED, DEBIT (NORMAL only), history row, `WITHDRAWAL_CONFIRMED` notification, committed together |
//! | the withdrawal is no longer in flight (a duplicate, or FAILED/REQUESTED) | `Skipped` with the current status; nothing written |
//! | the withdrawal does not exist | `Failed`: dead letter |
//! | bad data (empty tx hash, an amount the ledger refuses) | `Failed`: dead letter |
//! | database or broker fault | error: requeued, and retried up to the delivery limit |

mod confirmation;

pub use confirmation::{
    ConfirmError, Confirmation, Confirmed, WITHDRAWAL_CONFIRMED, WithdrawalKind, WithdrawalStatus,
    confirm_if_in_flight,
};

use paybus_platform::bus::{Context, Envelope, Handler, HandlerError, Message, Outcome};
use serde::{Deserialize, Serialize};

/// `withdrawal.tx_confirmed`: the chain monitor saw the withdrawal's transaction confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithdrawalTxConfirmed {
    pub withdrawal_id: u64,
    pub tx_hash: String,
}

impl Message for WithdrawalTxConfirmed {
    const TYPE: &'static str = "withdrawal.tx_confirmed";
}

/// The handler: one transaction per message, committed only when it made the transition.
pub struct ConfirmWithdrawal;

impl Handler for ConfirmWithdrawal {
    type Message = WithdrawalTxConfirmed;
    const FUNCTION: &'static str = "confirm-withdrawal";

    async fn handle(
        &self,
        message: Envelope<WithdrawalTxConfirmed>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let WithdrawalTxConfirmed {
            withdrawal_id,
            tx_hash,
        } = &message.data;
        let withdrawal_id = *withdrawal_id;
        let mut uow = ctx.outbox.begin().await?;
        let confirmation =
            confirm_if_in_flight(&mut uow, withdrawal_id, tx_hash, message.correlation_id).await;
        match confirmation {
            Ok(Confirmation::Transitioned(_)) => {
                uow.commit().await?;
                Ok(Outcome::Done)
            }
            Ok(Confirmation::NotTransitioned { status }) => {
                uow.rollback().await?;
                Ok(Outcome::Skipped(match status {
                    WithdrawalStatus::Confirmed => {
                        format!("withdrawal {withdrawal_id} is already CONFIRMED")
                    }
                    other => format!("withdrawal {withdrawal_id} is {other}, not in flight"),
                }))
            }
            Ok(Confirmation::NotFound) => {
                uow.rollback().await?;
                Ok(Outcome::Failed(format!(
                    "withdrawal {withdrawal_id} does not exist"
                )))
            }
            Err(error) => {
                // Explicitly, so no lock outlives the attempt; the error that matters is the
                // first one.
                if let Err(rollback) = uow.rollback().await {
                    tracing::warn!(%rollback, "rolling back a failed confirmation failed");
                }
                if error.is_retryable() {
                    Err(error.into())
                } else {
                    Ok(Outcome::Failed(error.to_string()))
                }
            }
        }
    }
}
