//! The confirm-deposit function (docs/workflows/confirmations.md, seed 001): `deposit.tx_confirmed {deposit_id}`
//! moves a DETECTED deposit to CONFIRMED exactly once, CREDITs the partner the gross amount
//! and records the fee.
//!
//! The same layers as confirm-withdrawal: a duplicate of a finished confirmation is answered
//! from one committed read ([`confirm`]); otherwise the row read under its lock decides and a
//! conditional UPDATE makes the transition ([`confirm_if_detected`]); and the ledger keys `DEP_CREDIT:{id}` / `DEP_FEE:{id}` are the
//! last line of defence (seed 001 §3: v2.21 already stopped a second deposit row, but not a
//! second ledger row).
//!
//! | delivery | outcome |
//! | --- | --- |
//! | this delivery made the transition | `Done`: CONFIRMED, CREDIT `amount`, FEE `fee` when `fee > 0`, `DEPOSIT_CONFIRMED` notification, committed together |
//! | the deposit is already CONFIRMED (a duplicate) | `Skipped`; nothing written |
//! | the deposit is FAILED (dropped or reorged here, yet confirmed on chain) | `Failed`: a dead letter for ops; nothing written |
//! | the deposit does not exist | `Failed`: dead letter |
//! | bad data (an amount the ledger refuses) | `Failed`: dead letter |
//! | database or broker fault | error: requeued, and retried up to the delivery limit |

mod confirmation;
mod triage;

pub use confirmation::{Confirmation, Confirmed, DEPOSIT_CONFIRMED, confirm_if_detected};
pub use paybus_confirmations::{DepositTxConfirmed, deposit::DepositStatus};

use paybus_confirmations::deposit;
use paybus_platform::{
    bus::{Context, Envelope, Handler, HandlerError, Outbox, Outcome, Services},
    function::{BuildError, Function},
    transition::Transition,
};

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
        confirm(ctx.outbox, message.data.deposit_id, message.correlation_id).await
    }
}

/// What the handler does with one confirmation, on `outbox`'s database: a plain read of the
/// committed status first (CONFIRMED and FAILED never change again, so it answers a duplicate
/// without a transaction), then [`confirm_if_detected`] under the row lock.
pub async fn confirm(
    outbox: &Outbox,
    deposit_id: u64,
    correlation_id: uuid::Uuid,
) -> Result<Outcome, HandlerError> {
    let committed = {
        let mut conn = outbox.pool().acquire().await?;
        deposit::committed_status(&mut conn, deposit_id).await?
    };
    if let Some(status) = committed
        && status.is_terminal()
    {
        return Ok(not_confirmed(deposit_id, status));
    }
    let mut uow = outbox.begin().await?;
    let result = confirm_if_detected(&mut uow, deposit_id, correlation_id).await;
    match Transition::commit_or_rollback(uow, result).await {
        Ok(confirmation) => Ok(confirmation
            .outcome(format_args!("deposit {deposit_id}"), |status| {
                not_confirmed(deposit_id, *status)
            })),
        Err(error) => error.into_outcome(),
    }
}

/// A duplicate is skipped; a confirmation of a FAILED deposit is a dead letter for ops.
fn not_confirmed(deposit_id: u64, status: DepositStatus) -> Outcome {
    match status {
        DepositStatus::Confirmed => {
            Outcome::Skipped(format!("deposit {deposit_id} is already CONFIRMED"))
        }
        status => Outcome::Failed(format!(
            "deposit {deposit_id} is {status}, not DETECTED, but its transaction was confirmed \
             on chain"
        )),
    }
}

impl Function for ConfirmDeposit {
    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(ConfirmDeposit)
    }

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: DepositTxConfirmed,
    ) -> Result<paybus_platform::triage::Triage, paybus_platform::triage::TriageError> {
        triage::triage(conn, message).await
    }
}
