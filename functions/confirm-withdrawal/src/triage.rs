//! What a replay of a dead-lettered `withdrawal.tx_confirmed` would do (`paybus dead-letters`).
//!
//! | the withdrawal now | verdict |
//! | --- | --- |
//! | its `WDR_CONFIRM:{id}` DEBIT is in the ledger, or it is CONFIRMED with this tx hash | already applied |
//! | in flight (BROADCASTING, PROCESSING, STALE) and the tx hash is valid | safe: a replay confirms it once |
//! | absent; CONFIRMED with another tx hash; FAILED; REQUESTED; an invalid tx hash | needs a human (the handler would dead-letter it again) |

use paybus_confirmations::withdrawal::{self, WithdrawalStatus};
use paybus_ledger::IdemKey;
use paybus_ops::triage::{Exposure, Triage, TriageError};
use sqlx::MySqlConnection;

use crate::WithdrawalTxConfirmed;

pub(crate) async fn triage(
    conn: &mut MySqlConnection,
    message: WithdrawalTxConfirmed,
) -> Result<Triage, TriageError> {
    let WithdrawalTxConfirmed {
        withdrawal_id,
        tx_hash,
    } = message;
    let Some(found) = withdrawal::find(conn, withdrawal_id).await? else {
        return Ok(
            Triage::needs_human(format!("withdrawal {withdrawal_id} does not exist"))
                .referring_to::<()>("withdrawal", withdrawal_id, None, None),
        );
    };
    let debited =
        paybus_ledger::key_exists(conn, &IdemKey::withdrawal_confirm(withdrawal_id)).await?;
    let status = found.status;
    let triage = if debited {
        Triage::already_applied(format!(
            "withdrawal {withdrawal_id} is {status} and its WDR_CONFIRM DEBIT is in the ledger"
        ))
    } else if status == WithdrawalStatus::Confirmed
        && found.tx_hash.as_deref() == Some(tx_hash.as_str())
    {
        Triage::already_applied(format!(
            "withdrawal {withdrawal_id} is already CONFIRMED with tx {tx_hash}"
        ))
    } else if let Err(invalid) = withdrawal::validate_tx_hash(&tx_hash) {
        Triage::needs_human(format!("withdrawal {withdrawal_id}: {invalid}"))
    } else if status.is_in_flight() {
        Triage::safe(format!(
            "withdrawal {withdrawal_id} is {status}: a replay confirms tx {tx_hash} once"
        ))
    } else {
        let recorded = found.tx_hash.as_deref().unwrap_or("none");
        Triage::needs_human(format!(
            "withdrawal {withdrawal_id} is {status} (recorded tx {recorded}), not in flight: \
             the function would refuse tx {tx_hash}"
        ))
    };
    Ok(triage
        .exposing(Exposure {
            entity: "withdrawal",
            id: withdrawal_id,
            partner_id: Some(found.partner_id),
            currency: found.currency.clone(),
            amount: found.amount,
        })
        .referring_to(
            "withdrawal",
            withdrawal_id,
            Some(status.to_string()),
            Some(&found),
        ))
}
