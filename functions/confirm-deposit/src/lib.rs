//! The confirm-deposit function (docs/workflows/confirmations.md, seed 001): `deposit.tx_confirmed
//! {deposit_id}` moves a DETECTED deposit to CONFIRMED exactly once, CREDITs the partner the gross
//! amount and records the fee. The same layers as confirm-withdrawal: a finished duplicate
//! answered from one committed read, W2's conditional transition ([`confirm_all_if_detected`]),
//! and the ledger keys `DEP_CREDIT:{id}` / `DEP_FEE:{id}` behind it (seed 001 §3). This crate is
//! the handler ([`ConfirmDeposit`], on [`paybus_confirmations::batch`]) and its triage.
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

pub use paybus_confirmations::{
    DepositTxConfirmed,
    deposit::{
        Confirmation, Confirmed, Confirming, DEPOSIT_CONFIRMED, DepositStatus,
        confirm_all_if_detected, confirm_if_detected,
    },
};

use std::fmt::Display;

use paybus_confirmations::{ConfirmError, batch, deposit};
use paybus_platform::{
    bus::{
        Batched, Context, Envelope, Handler, HandlerError, Outbox, Outcome, Services, UnitOfWork,
    },
    function::{BuildError, Function},
};
use sqlx::MySqlConnection;
use uuid::Uuid;

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
        confirm(ctx.db, message.data, message.correlation_id).await
    }

    /// confirm-withdrawal's size, for its reason: four concurrent batches fill the default
    /// prefetch of 64, each a handful of statements for up to 16 confirmations.
    const MAX_BATCH: usize = 16;

    async fn handle_batch(
        &self,
        messages: Vec<Batched<DepositTxConfirmed>>,
        outbox: &Outbox,
    ) -> Vec<Result<Outcome, HandlerError>> {
        let confirmations: Vec<_> = messages
            .into_iter()
            .map(|batched| (batched.message.data, batched.message.correlation_id))
            .collect();
        confirm_all(outbox, &confirmations).await
    }
}

/// What the handler does with one confirmation: [`confirm_all`] with one.
pub async fn confirm(
    outbox: &Outbox,
    confirmation: DepositTxConfirmed,
    correlation_id: Uuid,
) -> Result<Outcome, HandlerError> {
    batch::confirm::<ConfirmDeposit>(outbox, confirmation, correlation_id).await
}

/// The handler's confirmations, one result each in order (on `outbox`'s database; the
/// benchmark drives it directly too): the committed read answers the deposits already
/// CONFIRMED or FAILED, one transaction decides the rest under their row locks
/// ([`batch::confirm_all`]).
pub async fn confirm_all(
    outbox: &Outbox,
    confirmations: &[(DepositTxConfirmed, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    batch::confirm_all::<ConfirmDeposit>(outbox, confirmations).await
}

impl batch::Confirms for ConfirmDeposit {
    type Message = DepositTxConfirmed;
    type Confirmed = Confirmed;
    type Current = DepositStatus;

    fn id(message: &DepositTxConfirmed) -> u64 {
        message.deposit_id
    }

    fn subject(message: &DepositTxConfirmed) -> impl Display {
        format!("deposit {}", message.deposit_id)
    }

    async fn committed(
        conn: &mut MySqlConnection,
        ids: &[u64],
    ) -> Result<Vec<(u64, DepositStatus)>, ConfirmError> {
        deposit::committed_statuses(conn, ids).await
    }

    fn is_terminal(current: &DepositStatus) -> bool {
        current.is_terminal()
    }

    async fn transition(
        uow: &mut UnitOfWork<'_>,
        batch: &[(&DepositTxConfirmed, Uuid)],
    ) -> Result<Vec<Confirmation>, ConfirmError> {
        let batch: Vec<Confirming> = batch
            .iter()
            .map(|(message, correlation_id)| Confirming {
                deposit_id: message.deposit_id,
                correlation_id: *correlation_id,
            })
            .collect();
        confirm_all_if_detected(uow, &batch).await
    }

    /// A duplicate is skipped; a confirmation of a FAILED deposit is a dead letter for ops.
    fn not_confirmed(message: &DepositTxConfirmed, status: &DepositStatus) -> Outcome {
        let deposit_id = message.deposit_id;
        match status {
            DepositStatus::Confirmed => {
                Outcome::Skipped(format!("deposit {deposit_id} is already CONFIRMED"))
            }
            status => Outcome::Failed(format!(
                "deposit {deposit_id} is {status}, not DETECTED, but its transaction was \
                 confirmed on chain"
            )),
        }
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
