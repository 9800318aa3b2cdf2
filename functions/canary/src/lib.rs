//! The canary function: `canary.ping {ping_id}` ([`Ping`]) → the ping row PENDING → PONGED, once
//! ([`Canary`], its handler).
//!
//! The smallest real function: it shows the shape every workflow step has (a conditional
//! UPDATE decides, 0 rows means someone else did it) and lets ops prove the whole path works.

use paybus_bus::{Context, Envelope, Handler, HandlerError, Message, Outbox, Outcome, Services};
use paybus_runtime::function::{BuildError, Function};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    pub ping_id: u64,
}

impl Message for Ping {
    const TYPE: &'static str = "canary.ping";

    fn shard_key(&self) -> Option<String> {
        Some(self.ping_id.to_string())
    }
}

pub struct Canary;

impl Handler for Canary {
    type Message = Ping;
    const FUNCTION: &'static str = "canary";

    async fn handle(
        &self,
        message: Envelope<Ping>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let ping_id = message.data.ping_id;
        let mut tx = ctx.db.begin().await?;
        let ponged = sqlx::query(
            "UPDATE canary_pings SET status = 'PONGED', pongs = pongs + 1, ponged_at = NOW(6) \
             WHERE id = ? AND status = 'PENDING'",
        )
        .bind(ping_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if ponged == 1 {
            tx.commit().await?;
            return Ok(Outcome::Done);
        }
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM canary_pings WHERE id = ?")
                .bind(ping_id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.rollback().await?;
        Ok(match status {
            Some(status) => Outcome::Skipped(format!("ping {ping_id} is already {status}")),
            None => Outcome::Failed(format!("ping {ping_id} does not exist")),
        })
    }
}

impl Function for Canary {
    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(Canary)
    }
}

/// Inserts a ping and its message in one transaction; returns the ping id.
pub async fn send_ping(outbox: &Outbox) -> Result<u64, HandlerError> {
    let mut tx = outbox.begin().await?;
    let ping_id = sqlx::query("INSERT INTO canary_pings () VALUES ()")
        .execute(&mut *tx)
        .await?
        .last_insert_id();
    tx.send(&Envelope::new(Ping { ping_id })).await?;
    tx.commit().await?;
    Ok(ping_id)
}

/// Whether the canary function has handled the ping.
pub async fn is_ponged(pool: &sqlx::MySqlPool, ping_id: u64) -> Result<bool, sqlx::Error> {
    let status: Option<String> = sqlx::query_scalar("SELECT status FROM canary_pings WHERE id = ?")
        .bind(ping_id)
        .fetch_optional(pool)
        .await?;
    Ok(status.as_deref() == Some("PONGED"))
}
