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

/// Credits `cans` to the member's `container` balance. The UPDATE is also the member's row
/// lock (a completion takes it after its charge's, a grant after its job's); a separate
/// `SELECT … FOR UPDATE` before it was one statement more for the same lock. `Vanished` when
/// there is no such member.
pub async fn credit(
    conn: &mut MySqlConnection,
    id: u64,
    container: Container,
    cans: i32,
) -> Result<(), BonusError> {
    let sql = match container {
        Container::Pg => "UPDATE members SET pg_can = pg_can + ? WHERE id = ?",
        Container::Aos => "UPDATE members SET aos_can = aos_can + ? WHERE id = ?",
        Container::Ios => "UPDATE members SET ios_can = ios_can + ? WHERE id = ?",
    };
    // The connection counts matched rows (CLIENT_FOUND_ROWS), so 0 means no such member.
    let matched = sqlx::query(sql)
        .bind(cans)
        .bind(id)
        .execute(conn)
        .await?
        .rows_affected();
    if matched == 0 {
        return Err(BonusError::Vanished {
            entity: "member",
            id,
        });
    }
    Ok(())
}

/// One credit of [`credit_all`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    pub member_id: u64,
    pub container: Container,
    pub cans: i32,
}

/// Several credits in one UPDATE, which locks the members in id order (the order of every
/// batch, so two batches never wait on each other in a cycle over members). False when a member was not
/// found: nothing may be kept (roll back; one [`credit`] at a time names the missing one).
pub async fn credit_all(
    conn: &mut MySqlConnection,
    credits: &[Credit],
) -> Result<bool, sqlx::Error> {
    let mut members: Vec<u64> = credits.iter().map(|c| c.member_id).collect();
    members.sort_unstable();
    members.dedup();
    // FORCE INDEX: the UPDATE must lock these members and no other. A range on the primary
    // key is what MariaDB picks today, but a scan chosen on a small table's statistics would
    // lock every member — the ledger's gate read did exactly that.
    let mut sql =
        sqlx::QueryBuilder::<sqlx::MySql>::new("UPDATE members FORCE INDEX (PRIMARY) SET ");
    let containers = [
        (Container::Pg, "pg_can"),
        (Container::Aos, "aos_can"),
        (Container::Ios, "ios_can"),
    ];
    let mut first = true;
    for (container, column) in containers {
        let mut sums: Vec<(u64, i64)> = Vec::new();
        for credit in credits.iter().filter(|c| c.container == container) {
            match sums
                .iter_mut()
                .find(|(member, _)| *member == credit.member_id)
            {
                Some((_, sum)) => *sum += i64::from(credit.cans),
                None => sums.push((credit.member_id, i64::from(credit.cans))),
            }
        }
        if sums.is_empty() {
            continue;
        }
        if !first {
            sql.push(", ");
        }
        first = false;
        sql.push(format_args!("{column} = {column} + CASE id"));
        for (member, sum) in sums {
            sql.push(" WHEN ")
                .push_bind(member)
                .push(" THEN ")
                .push_bind(sum);
        }
        sql.push(" ELSE 0 END");
    }
    if first {
        return Ok(true);
    }
    sql.push(" WHERE id IN (");
    let mut ids = sql.separated(", ");
    for member in &members {
        ids.push_bind(*member);
    }
    sql.push(")");
    // Matched rows (CLIENT_FOUND_ROWS): one per member found.
    let matched = sql.build().execute(conn).await?.rows_affected();
    Ok(matched == members.len() as u64)
}
