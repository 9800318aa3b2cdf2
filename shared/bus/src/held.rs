//! Messages newer than this release knows: during a rolling deploy a new producer may send a
//! version ([`Message::VERSION`](crate::Message::VERSION)) that an old consumer of the same
//! queue cannot be trusted with. The consumer holds such a message in `held_messages` and acks
//! it: not handled, not dead-lettered, and not requeued (the broker's delivery limit would
//! dead-letter it while old consumers remain). A process that knows the version ([`release`],
//! a maintenance job) sends each held message again through the outbox, and a consumer of the
//! new release handles it once (docs/bus.md, "Changing a message").

use sqlx::{MySqlConnection, MySqlPool};

use crate::{
    OutgoingMessage,
    envelope::EnvelopeHead,
    outbox::{Outbox, OutboxError},
};

/// A function and the newest version of its message this process reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    pub function: &'static str,
    pub version: u16,
}

/// Holds `body`, a message of `head.version` for `function`; a redelivered copy is held once.
pub async fn hold(
    pool: &MySqlPool,
    function: &str,
    head: &EnvelopeHead,
    body: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO held_messages (function_name, message_id, routing_key, version, body) \
         VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE id = id",
    )
    .bind(function)
    .bind(head.id.to_string())
    .bind(&head.kind)
    .bind(head.version)
    .bind(body)
    .execute(pool)
    .await?;
    Ok(())
}

/// Sends again up to `limit` held messages that a function of `known` reads, each as a new
/// publication of the same envelope, and marks them released, in one unit of work; returns
/// how many. Messages newer still stay held; so do unreadable bodies, counted by
/// [`waiting`] (a held body was an envelope when it was held).
pub async fn release(outbox: &Outbox, known: &[Known], limit: u32) -> Result<u64, OutboxError> {
    let mut released = 0;
    let mut uow = outbox.begin().await?;
    for function in known {
        let rows: Vec<(u64, Vec<u8>)> = sqlx::query_as(
            "SELECT id, body FROM held_messages \
             WHERE released_at IS NULL AND function_name = ? AND version <= ? \
             ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(function.function)
        .bind(function.version)
        .bind(limit)
        .fetch_all(&mut *uow)
        .await?;
        for (id, body) in rows {
            let Ok(message) = OutgoingMessage::resend(&body) else {
                tracing::error!(
                    held = id,
                    function = function.function,
                    "a held message is not an envelope: left held"
                );
                continue;
            };
            uow.send_outgoing(message).await?;
            sqlx::query("UPDATE held_messages SET released_at = NOW(6) WHERE id = ?")
                .bind(id)
                .execute(&mut *uow)
                .await?;
            released += 1;
        }
    }
    uow.commit().await?;
    Ok(released)
}

/// Held messages not yet released, for `/metrics`.
pub async fn waiting(conn: &mut MySqlConnection) -> Result<u64, sqlx::Error> {
    let (count,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM held_messages WHERE released_at IS NULL")
            .fetch_one(conn)
            .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}
