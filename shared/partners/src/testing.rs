//! Fixtures for tests (feature `test-harness`).

use sqlx::MySqlPool;

/// The webhook secret every fixture partner signs with.
pub const PARTNER_SECRET: &str = "whsec_partner_test_secret";

/// A partner named `name` whose webhooks go to `webhook_url` (none: it takes no webhooks).
pub async fn partner(pool: &MySqlPool, name: &str, webhook_url: Option<&str>) -> u64 {
    sqlx::query("INSERT INTO partners (name, webhook_url, webhook_secret) VALUES (?, ?, ?)")
        .bind(name)
        .bind(webhook_url)
        .bind(PARTNER_SECRET)
        .execute(pool)
        .await
        .expect("insert a partner")
        .last_insert_id()
}
