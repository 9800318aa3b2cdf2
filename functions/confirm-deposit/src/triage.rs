//! What a replay of a dead-lettered `deposit.tx_confirmed` would do (`paybus dead-letters`).
//!
//! | the deposit now | verdict |
//! | --- | --- |
//! | CONFIRMED, or its `DEP_CREDIT:{id}` CREDIT is in the ledger | already applied |
//! | DETECTED | safe: a replay confirms and credits it once |
//! | absent, or FAILED (dropped or reorged here) | needs a human |

use paybus_confirmations::{
    DepositTxConfirmed,
    deposit::{self, DepositStatus},
};
use paybus_ledger::IdemKey;
use paybus_ops::triage::{Exposure, Triage, TriageError};
use sqlx::MySqlConnection;

pub(crate) async fn triage(
    conn: &mut MySqlConnection,
    message: DepositTxConfirmed,
) -> Result<Triage, TriageError> {
    let id = message.deposit_id;
    let Some(found) = deposit::find(conn, id).await? else {
        return Ok(Triage::needs_human(format!("deposit {id} does not exist"))
            .referring_to::<()>("deposit", id, None, None));
    };
    let credited = paybus_ledger::key_exists(conn, &IdemKey::deposit_credit(id)).await?;
    let status = found.status;
    let triage = match status {
        _ if credited => Triage::already_applied(format!(
            "deposit {id} is {status} and its DEP_CREDIT CREDIT is in the ledger"
        )),
        DepositStatus::Confirmed => {
            Triage::already_applied(format!("deposit {id} is already CONFIRMED"))
        }
        DepositStatus::Detected => Triage::safe(format!(
            "deposit {id} is DETECTED: a replay confirms and credits it once"
        )),
        DepositStatus::Failed => Triage::needs_human(format!(
            "deposit {id} is FAILED here, yet confirmed on chain: the function would refuse it"
        )),
    };
    Ok(triage
        .exposing(Exposure {
            entity: "deposit",
            id,
            partner_id: Some(found.partner_id),
            currency: found.currency.clone(),
            amount: found.amount,
        })
        .referring_to("deposit", id, Some(status.to_string()), Some(&found)))
}
