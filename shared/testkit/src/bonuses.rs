//! W3's fixtures: members, purchases and events as the app backend and ops would have written
//! them, the gateway's word that a purchase is paid, and the audit W3 must pass.

use chrono::{DateTime, Duration, Utc};
use paybus_money::Amount;
use paybus_ops::audit::Check;
use sqlx::MySqlPool;

use paybus_bonuses::{
    charge::{self, NewChargeRequest, PaymentGateway},
    completion::PaymentCompletion,
    event::{self, NewChargeEvent},
    member,
};

/// A member with empty balances.
pub async fn member(pool: &MySqlPool) -> u64 {
    let mut conn = pool.acquire().await.expect("a connection");
    member::create(&mut conn, "member")
        .await
        .expect("insert a member")
}

/// A purchase in REQUEST, and what its gateway will report.
#[derive(Debug, Clone)]
pub struct Purchase {
    pub id: u64,
    pub member_id: u64,
    pub gateway: PaymentGateway,
    pub cans: i32,
    pub price: Amount,
}

impl Purchase {
    /// The gateway's word that it is paid: its own payment id, the price.
    pub fn paid(&self) -> PaymentCompletion {
        PaymentCompletion {
            charge_id: self.id,
            gateway: self.gateway,
            gateway_tx_id: format!("{}-tx-{}", self.gateway, self.id),
            amount: self.price,
        }
    }
}

/// A purchase of `cans` through `gateway` (its default container), priced 100 per can.
pub async fn purchase(
    pool: &MySqlPool,
    member_id: u64,
    gateway: PaymentGateway,
    cans: i32,
) -> Purchase {
    let price = Amount::whole(i64::from(cans) * 100);
    let mut conn = pool.acquire().await.expect("a connection");
    let id = charge::create_request(
        &mut conn,
        &NewChargeRequest {
            member_id,
            cans,
            price,
            payment_gateway: gateway,
            container: gateway.default_container(),
            method: "card".to_owned(),
        },
    )
    .await
    .expect("insert a charge request");
    Purchase {
        id,
        member_id,
        gateway,
        cans,
        price,
    }
}

/// The database's clock (rows carry it; event windows are set around it).
pub async fn db_now(pool: &MySqlPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT NOW(6)")
        .fetch_one(pool)
        .await
        .expect("read the database clock")
}

/// An event active from a day ago to a day from now.
pub async fn active_event(
    pool: &MySqlPool,
    title: &str,
    add_percent: i32,
    available_count: i32,
) -> u64 {
    let now = db_now(pool).await;
    event_in(
        pool,
        title,
        add_percent,
        now - Duration::days(1),
        now + Duration::days(1),
        available_count,
    )
    .await
}

/// An active event with the window `[start_at, end_at]`.
pub async fn event_in(
    pool: &MySqlPool,
    title: &str,
    add_percent: i32,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    available_count: i32,
) -> u64 {
    let mut conn = pool.acquire().await.expect("a connection");
    event::create(
        &mut conn,
        &NewChargeEvent {
            title: title.to_owned(),
            add_percent,
            start_at,
            end_at,
            is_active: true,
            available_count,
        },
    )
    .await
    .expect("insert a charge event")
}

/// A member's balance in one container.
pub async fn cans(pool: &MySqlPool, member_id: u64, container: charge::Container) -> i32 {
    let mut conn = pool.acquire().await.expect("a connection");
    member::find(&mut conn, member_id)
        .await
        .expect("read the member")
        .expect("the member exists")
        .cans(container)
}

/// The invariants W3's rows must keep.
pub const AUDIT: &[&[Check]] = &[paybus_bonuses::audit::CHECKS];

/// Fails the test on any violation of [`AUDIT`].
pub async fn assert_audit_clean(pool: &MySqlPool) {
    crate::assert_audit_clean(pool, AUDIT).await;
}
