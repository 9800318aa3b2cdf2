//! The confirm-withdrawal function (docs/workflows/confirmations.md, seed 001):
//! `withdrawal.tx_confirmed {withdrawal_id, tx_hash}` moves an in-flight withdrawal to CONFIRMED
//! exactly once (seed 001 §1: two REPEATABLE READ snapshots both saw BROADCASTING, and the
//! partner was debited twice). What a delivery comes to is the domain's
//! (`paybus_confirmations::withdrawal::confirm_all`, the `WDR_CONFIRM:{id}` key behind it); this
//! crate is the handler ([`ConfirmWithdrawal`], one call of it) and its dead letters' triage.
//!
//! | delivery | outcome |
//! | --- | --- |
//! | this delivery made the transition | `Done`: CONFIRMED, DEBIT (NORMAL only), history row, `WITHDRAWAL_CONFIRMED` notification, committed together |
//! | the withdrawal is already CONFIRMED with this tx hash (a duplicate) | `Skipped`; nothing written |
//! | the withdrawal is CONFIRMED with another tx hash, or was never in flight (REQUESTED), or FAILED | `Failed` with both tx hashes: a dead letter for ops (an on-chain tx we did not expect); nothing written |
//! | the withdrawal does not exist | `Failed`: dead letter |
//! | bad data (empty tx hash, an amount the ledger refuses) | `Failed`: dead letter |
//! | database or broker fault | error: requeued, and retried up to the delivery limit |

mod triage;

use paybus_bus::{Batched, Context, Envelope, Handler, HandlerError, Outbox, Outcome, Services};
use paybus_confirmations::{WithdrawalTxConfirmed, batch, withdrawal};
use paybus_runtime::function::{BuildError, Function};

/// The handler: what the broker delivered together in one transaction (a single message is a
/// batch of one), committed only when it made a transition.
pub struct ConfirmWithdrawal;

impl Handler for ConfirmWithdrawal {
    type Message = WithdrawalTxConfirmed;
    const FUNCTION: &'static str = "confirm-withdrawal";

    async fn handle(
        &self,
        message: Envelope<WithdrawalTxConfirmed>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        withdrawal::confirm(ctx.db, &message.data, message.correlation_id).await
    }

    /// A dozen statements for up to 16 confirmations; the prefetch sets how many batches run at
    /// once (64: four). Half the size doubles the statements per message and is slower at the
    /// same prefetch; more batches come from a larger `PAYBUS_PREFETCH` (128 confirms 25 %
    /// more on two cores shared with the broker).
    const MAX_BATCH: usize = 16;

    async fn handle_batch(
        &self,
        messages: Vec<Batched<WithdrawalTxConfirmed>>,
        outbox: &Outbox,
    ) -> Vec<Result<Outcome, HandlerError>> {
        batch::confirm_delivered::<WithdrawalTxConfirmed>(outbox, messages).await
    }
}

impl Function for ConfirmWithdrawal {
    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(ConfirmWithdrawal)
    }

    async fn triage(
        conn: &mut sqlx::MySqlConnection,
        message: WithdrawalTxConfirmed,
    ) -> Result<paybus_ops::triage::Triage, paybus_ops::triage::TriageError> {
        triage::triage(conn, message).await
    }
}
