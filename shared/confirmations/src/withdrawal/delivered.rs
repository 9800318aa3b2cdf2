//! What a delivered `withdrawal.tx_confirmed` comes to, one message or a batch the broker
//! delivered together: W2's batch driver ([`crate::batch`]) around the transition
//! ([`confirm_all_if_in_flight`](super::confirm_all_if_in_flight)) — one committed read, then
//! one transaction for the rest. confirm-withdrawal's handler is one call of it.

use std::fmt::Display;

use paybus_bus::{HandlerError, Outbox, Outcome, UnitOfWork};
use sqlx::MySqlConnection;
use uuid::Uuid;

use super::{
    Confirming, WithdrawalState, WithdrawalStatus, committed_states,
    confirmation::{Confirmed, confirm_all_validated},
    validate_tx_hash,
};
use crate::{
    ConfirmError, WithdrawalTxConfirmed,
    batch::{self, Confirms, Decision},
};

/// One confirmation: [`confirm_all`] with one.
pub async fn confirm(
    outbox: &Outbox,
    confirmation: &WithdrawalTxConfirmed,
    correlation_id: Uuid,
) -> Result<Outcome, HandlerError> {
    batch::confirm::<WithdrawalTxConfirmed>(outbox, confirmation.clone(), correlation_id).await
}

/// One result per confirmation, in order ([`batch::confirm_all`]): a tx hash that cannot be
/// stored is a dead letter at once, a withdrawal already CONFIRMED or FAILED is answered from
/// the committed read, the rest are decided under their row locks in one transaction.
pub async fn confirm_all(
    outbox: &Outbox,
    confirmations: &[(WithdrawalTxConfirmed, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    batch::confirm_all::<WithdrawalTxConfirmed>(outbox, confirmations).await
}

impl Confirms for WithdrawalTxConfirmed {
    type Message = WithdrawalTxConfirmed;
    type Confirmed = Confirmed;
    type Current = WithdrawalState;

    fn id(message: &WithdrawalTxConfirmed) -> u64 {
        message.withdrawal_id
    }

    fn subject(message: &WithdrawalTxConfirmed) -> impl Display {
        format!("withdrawal {}", message.withdrawal_id)
    }

    fn validate(message: &WithdrawalTxConfirmed) -> Result<(), ConfirmError> {
        validate_tx_hash(&message.tx_hash)
    }

    async fn committed(
        conn: &mut MySqlConnection,
        ids: &[u64],
    ) -> Result<Vec<(u64, WithdrawalState)>, ConfirmError> {
        committed_states(conn, ids).await
    }

    fn is_terminal(current: &WithdrawalState) -> bool {
        current.status.is_terminal()
    }

    async fn transition(
        uow: &mut UnitOfWork<'_>,
        batch: &[(&WithdrawalTxConfirmed, Uuid)],
    ) -> Result<Vec<Decision<Self>>, ConfirmError> {
        let batch: Vec<Confirming<'_>> = batch
            .iter()
            .map(|(message, correlation_id)| Confirming {
                withdrawal_id: message.withdrawal_id,
                tx_hash: &message.tx_hash,
                correlation_id: *correlation_id,
            })
            .collect();
        confirm_all_validated(uow, &batch).await
    }

    /// A plain duplicate is skipped; anything else is an on-chain transaction ops must look at
    /// (seed 001, principle 9), so it is a dead letter that names both tx hashes.
    fn not_confirmed(message: &WithdrawalTxConfirmed, current: &WithdrawalState) -> Outcome {
        let (withdrawal_id, tx_hash) = (message.withdrawal_id, &message.tx_hash);
        let recorded = current.tx_hash.as_deref().unwrap_or("none");
        match current.status {
            WithdrawalStatus::Confirmed if current.tx_hash.as_deref() == Some(tx_hash) => {
                Outcome::Skipped(format!("withdrawal {withdrawal_id} is already CONFIRMED"))
            }
            WithdrawalStatus::Confirmed => Outcome::Failed(format!(
                "withdrawal {withdrawal_id} is already CONFIRMED with tx {recorded}, but this \
                 confirmation names tx {tx_hash}"
            )),
            status => Outcome::Failed(format!(
                "withdrawal {withdrawal_id} is {status}, not in flight, but tx {tx_hash} was \
                 confirmed on chain for it (recorded tx: {recorded})"
            )),
        }
    }
}
