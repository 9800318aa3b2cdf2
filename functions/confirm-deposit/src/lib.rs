//! The confirm-deposit function (SPEC W2, seed 001): `deposit.tx_confirmed {deposit_id}`
//! moves a DETECTED deposit to CONFIRMED exactly once, CREDITs the partner the gross amount
//! and records the fee.
//!
//! The same two layers as confirm-withdrawal: the conditional UPDATE decides
//! ([`confirm_if_detected`]), and the ledger keys `DEP_CREDIT:{id}` / `DEP_FEE:{id}` are the
//! last line of defence (seed 001 §3: v2.21 already stopped a second deposit row, but not a
//! second ledger row).
//!
//! | delivery | outcome |
//! | --- | --- |
//! | this delivery made the transition | `Done`: CONFIRMED, CREDIT `amount`, FEE `fee` when `fee > 0`, `DEPOSIT_CONFIRMED` notification, committed together |
//! | the deposit is no longer DETECTED (a duplicate, or FAILED) | `Skipped` with the current status; nothing written |
//! | the deposit does not exist | `Failed`: dead letter |
//! | bad data (an amount the ledger refuses) | `Failed`: dead letter |
//! | database or broker fault | error: requeued, and retried up to the delivery limit |

mod confirmation;

pub use confirmation::{
    ConfirmError, Confirmation, Confirmed, DEPOSIT_CONFIRMED, DepositStatus, confirm_if_detected,
};

use paybus_platform::bus::{Context, Envelope, Handler, HandlerError, Message, Outcome};
use serde::{Deserialize, Serialize};

/// `deposit.tx_confirmed`: the chain monitor saw the deposit's transaction confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositTxConfirmed {
    pub deposit_id: u64,
}

impl Message for DepositTxConfirmed {
    const TYPE: &'static str = "deposit.tx_confirmed";
}

/// The handler: one transaction per message, committed only when it made the transition.
pub struct ConfirmDeposit;

impl Handler for ConfirmDeposit {
    type Message = DepositTxConfirmed;
    const FUNCTION: &'static str = "confirm-deposit";

    async fn handle(
        &self,
        message: Envelope<DepositTxConfirmed>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let deposit_id = message.data.deposit_id;
        let mut uow = ctx.outbox.begin().await?;
        let confirmation = confirm_if_detected(&mut uow, deposit_id, message.correlation_id).await;
        match confirmation {
            Ok(Confirmation::Transitioned(_)) => {
                uow.commit().await?;
                Ok(Outcome::Done)
            }
            Ok(Confirmation::NotTransitioned { status }) => {
                uow.rollback().await?;
                Ok(Outcome::Skipped(match status {
                    DepositStatus::Confirmed => {
                        format!("deposit {deposit_id} is already CONFIRMED")
                    }
                    other => format!("deposit {deposit_id} is {other}, not DETECTED"),
                }))
            }
            Ok(Confirmation::NotFound) => {
                uow.rollback().await?;
                Ok(Outcome::Failed(format!(
                    "deposit {deposit_id} does not exist"
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
