//! Fixtures for tests (feature `test-harness`).

use sqlx::MySqlPool;

pub use paybus_platform::testing::sealer;

/// The webhook secret every fixture partner signs with (a legacy secret: its bytes are the
/// key).
pub const PARTNER_SECRET: &str = "whsec_partner_test_secret";

/// A partner named `name` whose webhooks go to `webhook_url` (none: it takes no webhooks),
/// signing with [`PARTNER_SECRET`] sealed under the test key.
pub async fn partner(pool: &MySqlPool, name: &str, webhook_url: Option<&str>) -> u64 {
    partner_with_key(pool, name, webhook_url, PARTNER_SECRET.as_bytes()).await
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
    crate::webhook_secrets::insert(&mut conn, &sealer(), id, key)
        .await
        .expect("seal the partner's secret");
    id
}
