//! What a confirmation owes once it has made its transition, in the same transaction: its
//! keyed ledger entries and the partner's notification.

use paybus_bus::UnitOfWork;
use paybus_ledger::{self as ledger, LedgerError, Posted, Posting};
use paybus_partners::notifications::{self, NewNotification};
use sqlx::MySqlConnection;
use uuid::Uuid;

use crate::ConfirmError;

/// Posts one keyed entry: [`post_keyed_all`] with one.
pub async fn post_keyed(
    conn: &mut MySqlConnection,
    posting: &Posting,
) -> Result<Posted, ConfirmError> {
    let mut posted = post_keyed_all(conn, std::slice::from_ref(posting)).await?;
    posted
        .pop()
        .ok_or(ConfirmError::Ledger(LedgerError::Incomplete {
            written: 0,
            expected: 1,
        }))
}

/// Posts keyed entries ([`ledger::post_all`]), one [`Posted`] each in order. A key already in
/// the ledger means the transition was ours but the entry was not (some other path wrote it):
/// the key held, it is logged, and the confirmation still completes.
pub async fn post_keyed_all(
    conn: &mut MySqlConnection,
    postings: &[Posting],
) -> Result<Vec<Posted>, ConfirmError> {
    let posted = ledger::post_all(conn, postings).await?;
    for (posting, posted) in postings.iter().zip(&posted) {
        if let Posted::AlreadyRecorded { idem_key } = posted {
            tracing::warn!(
                reference_type = %posting.reference_type,
                reference_id = posting.reference_id,
                idem_key = idem_key.as_str(),
                "confirmation entry already recorded; not posted again"
            );
        }
    }
    Ok(posted)
}

/// The notification row and its message: [`notify_partners`] with one.
pub async fn notify_partner(
    uow: &mut UnitOfWork<'_>,
    notification: &NewNotification<'_>,
    correlation_id: Uuid,
) -> Result<Option<u64>, ConfirmError> {
    let mut ids = notify_partners(uow, &[(notification.clone(), correlation_id)]).await?;
    Ok(ids.pop().flatten())
}

/// A row whose transition owes its partner a notification.
pub trait Notifies {
    /// `partner_notifications.event`.
    const EVENT: &'static str;
    /// `partner_notifications.reference_type`.
    const REFERENCE_TYPE: &'static str;

    /// The partner to notify, and the reference (the row's id).
    fn partner_and_reference(&self) -> (u64, u64);

    /// The JSON the partner receives (frozen in the notification row).
    fn payload(&self) -> serde_json::Value;
}

/// The notifications `rows` owe, each with its message's correlation id: their payloads, then
/// [`notify_partners`].
pub async fn notify_all<'r, R: Notifies + 'r>(
    uow: &mut UnitOfWork<'_>,
    rows: impl Iterator<Item = (&'r R, Uuid)> + Clone,
) -> Result<Vec<Option<u64>>, ConfirmError> {
    let payloads: Vec<serde_json::Value> = rows.clone().map(|(row, _)| row.payload()).collect();
    let owed: Vec<(NewNotification<'_>, Uuid)> = rows
        .zip(&payloads)
        .map(|((row, correlation_id), payload)| {
            let (partner_id, reference_id) = row.partner_and_reference();
            let notification = NewNotification {
                partner_id,
                event: R::EVENT,
                reference_type: R::REFERENCE_TYPE,
                reference_id,
                payload,
            };
            (notification, correlation_id)
        })
        .collect();
    notify_partners(uow, &owed).await
}

/// The notification rows and their messages, in this transaction; the webhooks themselves go
/// out after commit (deliver-webhook, principle 8). One id per notification, `None` where it
/// already existed.
pub async fn notify_partners(
    uow: &mut UnitOfWork<'_>,
    notifications: &[(NewNotification<'_>, Uuid)],
) -> Result<Vec<Option<u64>>, ConfirmError> {
    let entity = notifications
        .first()
        .map_or("notification", |(n, _)| n.reference_type);
    notifications::enqueue_all(uow, notifications)
        .await
        .map_err(|source| ConfirmError::Notification { entity, source })
}
