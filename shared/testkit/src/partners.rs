//! Partners' fixtures: a partner with a sealed webhook secret.

use sqlx::MySqlPool;

use crate::sealer;

/// The webhook secret every fixture partner signs with (a legacy secret: its bytes are the
/// key).
pub const PARTNER_SECRET: &str = "whsec_partner_test_secret";

/// A partner named `name` whose webhooks go to `webhook_url` (none: it takes no webhooks),
/// signing with [`PARTNER_SECRET`] sealed under the test key.
pub async fn partner(pool: &MySqlPool, name: &str, webhook_url: Option<&str>) -> u64 {
    partner_with_key(pool, name, webhook_url, PARTNER_SECRET.as_bytes()).await
}

/// The body of the `WITHDRAWAL_CONFIRMED` notification of withdrawal `withdrawal_id`.
pub fn withdrawal_confirmed(withdrawal_id: u64) -> serde_json::Value {
    serde_json::json!({
        "event": "WITHDRAWAL_CONFIRMED",
        "withdrawal_id": withdrawal_id,
        "amount": "100.000000",
        "currency": "USDT",
    })
}

/// A PENDING `WITHDRAWAL_CONFIRMED` notification of withdrawal `withdrawal_id` to
/// `partner_id`, with the body of [`withdrawal_confirmed`] but without its message: for tests
/// that hand deliver-webhook the message themselves.
pub async fn notification(pool: &MySqlPool, partner_id: u64, withdrawal_id: u64) -> u64 {
    sqlx::query(
        "INSERT INTO partner_notifications \
         (partner_id, event, reference_type, reference_id, payload) \
         VALUES (?, 'WITHDRAWAL_CONFIRMED', 'WITHDRAWAL', ?, ?)",
    )
    .bind(partner_id)
    .bind(withdrawal_id)
    .bind(withdrawal_confirmed(withdrawal_id).to_string())
    .execute(pool)
    .await
    .expect("insert a notification")
    .last_insert_id()
}

/// [`partner`] with its own secret's key.
pub async fn partner_with_key(
    pool: &MySqlPool,
    name: &str,
    webhook_url: Option<&str>,
    key: &[u8],
) -> u64 {
    let mut conn = pool.acquire().await.expect("a connection");
    let id = sqlx::query("INSERT INTO partners (name, webhook_url) VALUES (?, ?)")
        .bind(name)
        .bind(webhook_url)
        .execute(&mut *conn)
        .await
        .expect("insert a partner")
        .last_insert_id();
    paybus_partners::webhook_secrets::insert(&mut conn, &sealer(), id, key)
        .await
        .expect("seal the partner's secret");
    id
}
