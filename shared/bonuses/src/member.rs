//! Members and their can balances (one per container). A balance changes only under the
//! member's row lock, in the transaction that writes the charge it comes from (the migration's
//! header comment says why).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::MySqlConnection;

use crate::{BonusError, charge::Container};

/// A member as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Member {
    pub id: u64,
    pub nickname: String,
    pub pg_can: i32,
    pub aos_can: i32,
    pub ios_can: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Member {
    /// The balance of one container.
    pub fn cans(&self, container: Container) -> i32 {
        match container {
            Container::Pg => self.pg_can,
            Container::Aos => self.aos_can,
            Container::Ios => self.ios_can,
        }
    }
}

/// Inserts a member with empty balances.
pub async fn create(conn: &mut MySqlConnection, nickname: &str) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query("INSERT INTO members (nickname) VALUES (?)")
        .bind(nickname)
        .execute(conn)
        .await?
        .last_insert_id())
}

/// The member, or `None`.
pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Member>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, nickname, pg_can, aos_can, ios_can, created_at, updated_at \
         FROM members WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(conn)
    .await
}

/// Takes the member's row lock for the rest of the caller's transaction (the seed's
/// `findByIdForUpdate`): every credit to this member waits for it, so none is lost.
pub async fn lock(conn: &mut MySqlConnection, id: u64) -> Result<(), BonusError> {
    let locked: Option<u64> = sqlx::query_scalar("SELECT id FROM members WHERE id = ? FOR UPDATE")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    locked.map(|_| ()).ok_or(BonusError::Vanished {
        entity: "member",
        id,
    })
}

/// Adds `cans` to one container's balance; the caller holds the member's lock ([`lock`]).
pub async fn credit(
    conn: &mut MySqlConnection,
    id: u64,
    container: Container,
    cans: i32,
) -> Result<(), sqlx::Error> {
    let sql = match container {
        Container::Pg => "UPDATE members SET pg_can = pg_can + ? WHERE id = ?",
        Container::Aos => "UPDATE members SET aos_can = aos_can + ? WHERE id = ?",
        Container::Ios => "UPDATE members SET ios_can = ios_can + ? WHERE id = ?",
    };
    sqlx::query(sql).bind(cans).bind(id).execute(conn).await?;
    Ok(())
}
