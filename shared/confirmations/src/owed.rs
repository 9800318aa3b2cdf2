//! What a confirmation owes once it has made its transition, in the same transaction: its
//! keyed ledger entries and the partner's notification.

use paybus_ledger::{self as ledger, Posted, Posting};
use paybus_partners::notifications::{self, NewNotification};
use paybus_platform::bus::UnitOfWork;
use sqlx::MySqlConnection;
use uuid::Uuid;

use crate::ConfirmError;

/// Posts one keyed entry. A key already in the ledger means the transition was ours but the
/// entry was not (some other path wrote it): the key held, it is logged, and the confirmation
/// still completes.
pub async fn post_keyed(
    conn: &mut MySqlConnection,
    posting: &Posting,
) -> Result<Posted, ConfirmError> {
    let posted = ledger::post(conn, posting).await?;
    if let Posted::AlreadyRecorded { idem_key } = &posted {
        tracing::warn!(
            reference_type = %posting.reference_type,
            reference_id = posting.reference_id,
            idem_key = idem_key.as_str(),
            "confirmation entry already recorded; not posted again"
        );
    }
    Ok(posted)
}

/// The notification row and its message, in this transaction; the webhook itself goes out
/// after commit (deliver-webhook, principle 8). `None` when it already existed.
pub async fn notify_partner(
    uow: &mut UnitOfWork<'_>,
    notification: &NewNotification<'_>,
    correlation_id: Uuid,
) -> Result<Option<u64>, ConfirmError> {
    notifications::enqueue(uow, notification, correlation_id)
        .await
        .map_err(|source| ConfirmError::Notification {
            entity: notification.reference_type,
            source,
        })
}
