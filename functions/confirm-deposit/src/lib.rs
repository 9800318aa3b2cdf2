//! The confirm-deposit function (docs/workflows/confirmations.md, seed 001): `deposit.tx_confirmed
//! {deposit_id}` moves a DETECTED deposit to CONFIRMED exactly once, CREDITs the partner the gross
//! amount and records the fee: one committed read, W2's conditional transition and the ledger
//! keys `DEP_CREDIT:{id}` / `DEP_FEE:{id}` behind it (seed 001 §3), all the domain's
//! (`paybus_confirmations::deposit::confirm_all`). This crate is the handler
//! ([`ConfirmDeposit`], one call of it) and its triage.
//!
//! | delivery | outcome |
//! | --- | --- |
//! | this delivery made the transition | `Done`: CONFIRMED, CREDIT `amount`, FEE `fee` when `fee > 0`, `DEPOSIT_CONFIRMED` notification, committed together |
//! | the deposit is already CONFIRMED (a duplicate) | `Skipped`; nothing written |
//! | the deposit is FAILED (dropped or reorged here, yet confirmed on chain) | `Failed`: a dead letter for ops; nothing written |
//! | the deposit does not exist | `Failed`: dead letter |
//! | bad data (an amount the ledger refuses) | `Failed`: dead letter |
//! | database or broker fault | error: requeued, and retried up to the delivery limit |

mod triage;

use paybus_bus::{Batched, Context, Envelope, Handler, HandlerError, Outbox, Outcome, Services};
use paybus_confirmations::{DepositTxConfirmed, batch, deposit};
use paybus_runtime::function::{BuildError, Function};

/// The handler: what the broker delivered together in one transaction (a single message is a
/// batch of one), committed only when it made a transition.
pub struct ConfirmDeposit;

impl Handler for ConfirmDeposit {
    type Message = DepositTxConfirmed;
    const FUNCTION: &'static str = "confirm-deposit";

    async fn handle(
        &self,
        message: Envelope<DepositTxConfirmed>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        deposit::confirm(ctx.db, &message.data, message.correlation_id).await
    }

    /// confirm-withdrawal's size, for its reason: four concurrent batches fill the default
    /// prefetch of 64, each a handful of statements for up to 16 confirmations.
    const MAX_BATCH: usize = 16;

    async fn handle_batch(
        &self,
        messages: Vec<Batched<DepositTxConfirmed>>,
        outbox: &Outbox,
    ) -> Vec<Result<Outcome, HandlerError>> {
        batch::confirm_delivered::<DepositTxConfirmed>(outbox, messages).await
    }
}

impl Function for ConfirmDeposit {
    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(ConfirmDeposit)
    }

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: DepositTxConfirmed,
    ) -> Result<paybus_ops::triage::Triage, paybus_ops::triage::TriageError> {
        triage::triage(conn, message).await
    }
}
