//! What a replay of a dead-lettered `partner.notification.created` would do.
//!
//! | the notification now | verdict |
//! | --- | --- |
//! | DELIVERED, or SKIPPED (the partner takes no webhooks) | already applied |
//! | PENDING | safe: a replay claims it (a duplicate in flight is skipped under its lease) |
//! | FAILED (the attempt limit was reached), the partner's breaker closed or half-open | safe: the replay makes it PENDING again under the same id (fresh attempts) and delivers it |
//! | FAILED, the breaker still open | needs a human: the endpoint still fails; replay after the cool-down, or once the partner says it is fixed |
//! | absent | needs a human |
//!
//! A webhook moves no money (the transition that owes it already did), so no exposure.

use paybus_ops::triage::{Triage, TriageError};
use paybus_partners::{
    breaker::{self, BreakerState},
    notifications::{self, NotificationCreated, NotificationStatus},
};
use paybus_retry::Clock;
use sqlx::MySqlConnection;

/// A safe FAILED notification is PENDING again before its message is re-sent (the function
/// refuses a FAILED row); any other state is left as it stands.
pub(crate) async fn prepare_replay(
    conn: &mut MySqlConnection,
    message: NotificationCreated,
) -> Result<(), TriageError> {
    if notifications::reopen_failed(conn, message.notification_id).await? {
        tracing::info!(
            notification_id = message.notification_id,
            "FAILED notification put back to PENDING by a replay"
        );
    }
    Ok(())
}

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
        Ok(NotificationStatus::Failed) => {
            let last_error = found.last_error.as_deref().unwrap_or("none recorded");
            let breaker = breaker::read(conn, found.partner_id, &Clock::Database).await?;
            match breaker.map(|b| (b.state(), b)) {
                Some((BreakerState::Open, read)) => Triage::needs_human(format!(
                    "notification {id} is FAILED after {} attempts (last error: {last_error}) \
                     and partner {}'s breaker is open for {} s more: its endpoint still \
                     fails; replay after the cool-down, or once the partner says it is fixed",
                    found.attempts,
                    found.partner_id,
                    read.remaining().as_secs()
                )),
                _ => Triage::safe(format!(
                    "notification {id} is FAILED after {} attempts (last error: {last_error}); \
                     partner {}'s breaker is closed: a replay delivers it again under the same \
                     id",
                    found.attempts, found.partner_id
                )),
            }
        }
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
