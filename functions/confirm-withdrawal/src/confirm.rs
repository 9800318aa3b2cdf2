//! What the handler answers for the confirmations the broker delivered together, one message
//! being a batch of one: W2's batch driver ([`paybus_confirmations::batch`], shared with
//! confirm-deposit) around [`withdrawal::confirm_all_if_in_flight`] — one committed read, then
//! one transaction for the rest, about a dozen statements whatever their number.

use std::fmt::Display;

use paybus_confirmations::{
    ConfirmError,
    batch::{self, Confirms, Decision},
    withdrawal::{self, Confirming, WithdrawalState, confirm_all_if_in_flight},
};
use paybus_platform::bus::{HandlerError, Outbox, Outcome, UnitOfWork};
use sqlx::MySqlConnection;
use uuid::Uuid;

use crate::{ConfirmWithdrawal, WithdrawalTxConfirmed, not_confirmed};

/// What the handler does with one confirmation: [`confirm_all`] with one.
pub async fn confirm(
    outbox: &Outbox,
    confirmation: &WithdrawalTxConfirmed,
    correlation_id: Uuid,
) -> Result<Outcome, HandlerError> {
    batch::confirm::<ConfirmWithdrawal>(outbox, confirmation.clone(), correlation_id).await
}

/// The handler's confirmations (on `outbox`'s database; the benchmark drives it directly too):
/// one result per confirmation, in order ([`batch::confirm_all`]): a tx hash that cannot be
/// stored is a dead letter at once, a withdrawal already CONFIRMED or FAILED is answered from
/// the committed read, the rest are decided under their row locks in one transaction.
pub async fn confirm_all(
    outbox: &Outbox,
    confirmations: &[(WithdrawalTxConfirmed, Uuid)],
) -> Vec<Result<Outcome, HandlerError>> {
    batch::confirm_all::<ConfirmWithdrawal>(outbox, confirmations).await
}

impl Confirms for ConfirmWithdrawal {
    type Message = WithdrawalTxConfirmed;
    type Confirmed = withdrawal::Confirmed;
    type Current = WithdrawalState;

    fn id(message: &WithdrawalTxConfirmed) -> u64 {
        message.withdrawal_id
    }

    fn subject(message: &WithdrawalTxConfirmed) -> impl Display {
        format!("withdrawal {}", message.withdrawal_id)
    }

    fn validate(message: &WithdrawalTxConfirmed) -> Result<(), ConfirmError> {
        withdrawal::validate_tx_hash(&message.tx_hash)
    }

    async fn committed(
        conn: &mut MySqlConnection,
        ids: &[u64],
    ) -> Result<Vec<(u64, WithdrawalState)>, ConfirmError> {
        withdrawal::committed_states(conn, ids).await
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
        confirm_all_if_in_flight(uow, &batch).await
    }

    fn not_confirmed(message: &WithdrawalTxConfirmed, current: &WithdrawalState) -> Outcome {
        not_confirmed(message.withdrawal_id, &message.tx_hash, current)
    }
}
