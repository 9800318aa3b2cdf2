//! Partner notifications owed by a transition (principle 8): written in the transition's own
//! transaction together with the `partner.notification.created` message, delivered after
//! commit by the deliver-webhook function. Shared because every confirming function creates
//! them; the delivery lives in `functions/deliver-webhook`.

use serde::{Deserialize, Serialize};

use crate::bus::{Envelope, HandlerError, Message, UnitOfWork};

/// `partner.notification.created {notification_id}`: a notification row is ready to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationCreated {
    pub notification_id: u64,
}

impl Message for NotificationCreated {
    const TYPE: &'static str = "partner.notification.created";
}

/// One notification to create.
#[derive(Debug, Clone)]
pub struct NewNotification<'a> {
    pub partner_id: u64,
    /// e.g. `WITHDRAWAL_CONFIRMED`
    pub event: &'a str,
    pub reference_type: &'a str,
    pub reference_id: u64,
    /// The JSON body the partner receives, frozen now.
    pub payload: &'a serde_json::Value,
}

/// Inserts the notification and its message in `uow`'s transaction. `None` when one already
/// exists for (event, reference): the unique key is the last line of defence against a
/// second `WITHDRAWAL_CONFIRMED`, and hitting it is expected, not an error.
pub async fn enqueue(
    uow: &mut UnitOfWork<'_>,
    notification: &NewNotification<'_>,
    correlation_id: uuid::Uuid,
) -> Result<Option<u64>, HandlerError> {
    let inserted = sqlx::query(
        "INSERT INTO partner_notifications (partner_id, event, reference_type, reference_id, payload) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .bind(notification.partner_id)
    .bind(notification.event)
    .bind(notification.reference_type)
    .bind(notification.reference_id)
    .bind(notification.payload.to_string())
    .execute(&mut **uow)
    .await;
    // MySQL rolls back only the failed statement: the transaction stays usable after a
    // duplicate. Only this key counts as "already there"; any other error propagates.
    let id = match inserted {
        Ok(done) => done.last_insert_id(),
        Err(sqlx::Error::Database(e))
            if e.is_unique_violation()
                && e.message()
                    .contains("uk_partner_notifications_event_reference") =>
        {
            tracing::warn!(
                event = notification.event,
                reference_type = notification.reference_type,
                reference_id = notification.reference_id,
                "notification already exists; not sent again"
            );
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    uow.send(&Envelope::with_correlation(
        correlation_id,
        NotificationCreated {
            notification_id: id,
        },
    ))
    .await?;
    Ok(Some(id))
}
