//! What a delivered `deposit.tx_confirmed` comes to, one message or a batch the broker
//! delivered together: W2's batch driver ([`crate::batch`]) around the transition
//! ([`confirm_all_if_detected`]) — one committed read, then one transaction for the rest.
//! confirm-deposit's handler is one call of it.

use std::fmt::Display;

use paybus_bus::{HandlerError, Outbox, Outcome, UnitOfWork};
use sqlx::MySqlConnection;
use uuid::Uuid;

use super::{
    Confirmation, Confirming, DepositStatus, committed_statuses,
    confirmation::{Confirmed, confirm_all_if_detected},
};
use crate::{
    ConfirmError, DepositTxConfirmed,
    batch::{self, Confirms},
};

/// One confirmation: [`confirm_all`] with one.
pub async fn confirm(
    outbox: &Outbox,
    confirmation: &DepositTxConfirmed,
    correlation_id: Uuid,
) -> Result<Outcome, HandlerError> {
    batch::confirm::<DepositTxConfirmed>(outbox, confirmation.clone(), correlation_id).await
}

/// One result per confirmation, in order ([`batch::confirm_all`]): the committed read answers
/// the deposits already CONFIRMED or FAILED, one transaction decides the rest under their row
/// locks.
pub async fn confirm_all(
    outbox: &Outbox,
    confirmations: &[(DepositTxConfirmed, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    batch::confirm_all::<DepositTxConfirmed>(outbox, confirmations).await
}

impl Confirms for DepositTxConfirmed {
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
        committed_statuses(conn, ids).await
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
