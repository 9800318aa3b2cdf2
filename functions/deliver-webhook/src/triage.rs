//! What a replay of a dead-lettered `partner.notification.created` would do.
//!
//! | the notification now | verdict |
//! | --- | --- |
//! | DELIVERED, or SKIPPED (the partner takes no webhooks) | already applied |
//! | PENDING | safe: a replay claims it (a duplicate in flight is skipped under its lease) |
//! | FAILED (the attempt limit was reached) | needs a human: the function refuses a FAILED row |
//! | absent | needs a human |
//!
//! A webhook moves no money (the transition that owes it already did), so no exposure.

use paybus_partners::notifications::{self, NotificationCreated, NotificationStatus};
use paybus_platform::triage::{Triage, TriageError};
use sqlx::MySqlConnection;

pub(crate) async fn triage(
    conn: &mut MySqlConnection,
    message: NotificationCreated,
) -> Result<Triage, TriageError> {
    let id = message.notification_id;
    let Some(found) = notifications::find(conn, id).await? else {
        return Ok(
            Triage::needs_human(format!("notification {id} does not exist")).referring_to::<()>(
                "partner_notification",
                id,
                None,
                None,
            ),
        );
    };
    let triage = match found.status.parse::<NotificationStatus>() {
        Ok(NotificationStatus::Delivered) => Triage::already_applied(format!(
            "notification {id} was delivered to partner {}",
            found.partner_id
        )),
        Ok(NotificationStatus::Skipped) => Triage::already_applied(format!(
            "notification {id} is SKIPPED: partner {} takes no webhooks",
            found.partner_id
        )),
        Ok(NotificationStatus::Pending) => Triage::safe(format!(
            "notification {id} is PENDING (attempt {}): a replay delivers it",
            found.attempts
        )),
        Ok(NotificationStatus::Failed) => Triage::needs_human(format!(
            "notification {id} is FAILED after {} attempts (last error: {}): the function \
             refuses a FAILED row; check the partner's endpoint first",
            found.attempts,
            found.last_error.as_deref().unwrap_or("none recorded")
        )),
        Err(_) => Triage::needs_human(format!(
            "notification {id} has an unknown status {:?}",
            found.status
        )),
    };
    Ok(triage.referring_to(
        "partner_notification",
        id,
        Some(found.status.clone()),
        Some(&found),
    ))
}
