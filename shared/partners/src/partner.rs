//! The `partners` row: who a partner is and where its webhooks go.

use chrono::{DateTime, Utc};
use paybus_platform::{
    ops_log::{self, Entry},
    redact,
};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection};

use crate::breaker::{BreakerRead, BreakerState};

/// A partner as it may be shown: the webhook secret is never read back out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partner {
    pub id: u64,
    pub name: String,
    pub webhook_url: Option<String>,
    /// The circuit breaker of webhook delivery to this partner.
    pub webhook_breaker: BreakerView,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A partner's breaker as ops see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerView {
    pub state: BreakerState,
    pub consecutive_failures: u32,
    /// Until when deliveries are parked (open), or since when a probe may go (half-open).
    pub open_until: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct PartnerRow {
    id: u64,
    name: String,
    webhook_url: Option<String>,
    webhook_failures: u32,
    webhook_open_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// A partner to create, validated by [`NewPartner::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPartner {
    name: String,
    webhook_url: Option<String>,
    webhook_secret: String,
}

/// Why a partner cannot be created as asked (a client mistake, in the caller's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartnerError {
    #[error("name must not be empty")]
    EmptyName,
    #[error("name is longer than {NAME_MAX_CHARS} characters")]
    NameTooLong,
    #[error(
        "webhook_url must be an absolute http:// or https:// URL of at most {WEBHOOK_URL_MAX_CHARS} characters"
    )]
    InvalidWebhookUrl,
    #[error("webhook_secret must be 16 to 255 bytes long")]
    InvalidWebhookSecret,
}

pub const NAME_MAX_CHARS: usize = 190;
pub const WEBHOOK_URL_MAX_CHARS: usize = 2000;

impl NewPartner {
    pub fn new(
        name: &str,
        webhook_url: Option<&str>,
        webhook_secret: &str,
    ) -> Result<Self, PartnerError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(PartnerError::EmptyName);
        }
        if name.chars().count() > NAME_MAX_CHARS {
            return Err(PartnerError::NameTooLong);
        }
        let webhook_url = webhook_url.map(parse_webhook_url).transpose()?;
        if !(16..=255).contains(&webhook_secret.len()) {
            return Err(PartnerError::InvalidWebhookSecret);
        }
        Ok(Self {
            name: name.to_owned(),
            webhook_url,
            webhook_secret: webhook_secret.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

fn parse_webhook_url(raw: &str) -> Result<String, PartnerError> {
    let url = url::Url::parse(raw.trim()).map_err(|_| PartnerError::InvalidWebhookUrl)?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host().is_none()
        || raw.len() > WEBHOOK_URL_MAX_CHARS
    {
        return Err(PartnerError::InvalidWebhookUrl);
    }
    Ok(url.to_string())
}

/// Inserts the partner and logs its creation in the ops log (`partner.create`, by `actor`: its
/// name and webhook URL with any password hidden, never the secret), in one transaction;
/// returns its id.
pub async fn create(
    conn: &mut MySqlConnection,
    new: &NewPartner,
    actor: &str,
) -> Result<u64, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let id =
        sqlx::query("INSERT INTO partners (name, webhook_url, webhook_secret) VALUES (?, ?, ?)")
            .bind(&new.name)
            .bind(&new.webhook_url)
            .bind(&new.webhook_secret)
            .execute(&mut *tx)
            .await?
            .last_insert_id();
    ops_log::append(
        &mut tx,
        &Entry {
            actor,
            action: "partner.create",
            subject: &format!("partner:{id}"),
            detail: &serde_json::json!({
                "name": new.name,
                "webhook_url": new.webhook_url.as_deref().map(redact::text),
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Partner>, sqlx::Error> {
    let row: Option<PartnerRow> = sqlx::query_as(
        "SELECT id, name, webhook_url, webhook_failures, webhook_open_until, NOW(6) AS now, \
                created_at, updated_at \
         FROM partners WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| {
        let breaker = BreakerRead {
            failures: row.webhook_failures,
            open_until: row.webhook_open_until,
            now: row.now,
        };
        Partner {
            id: row.id,
            name: row.name,
            webhook_url: row.webhook_url,
            webhook_breaker: BreakerView {
                state: breaker.state(),
                consecutive_failures: breaker.failures,
                open_until: breaker.open_until,
            },
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_absolute_http() {
        let with = |url| NewPartner::new("p", Some(url), "0123456789abcdef");
        assert_eq!(
            with("https://partner.example/hooks")
                .map(|p| p.webhook_url)
                .ok()
                .flatten()
                .as_deref(),
            Some("https://partner.example/hooks")
        );
        assert!(with("http://127.0.0.1:9000/x").is_ok());
        for bad in ["ftp://partner.example/", "/relative", "not a url"] {
            assert_eq!(with(bad), Err(PartnerError::InvalidWebhookUrl), "{bad}");
        }
    }

    #[test]
    fn names_and_secrets_are_bounded() {
        assert_eq!(
            NewPartner::new("  ", None, "0123456789abcdef"),
            Err(PartnerError::EmptyName)
        );
        assert_eq!(
            NewPartner::new(&"n".repeat(191), None, "0123456789abcdef"),
            Err(PartnerError::NameTooLong)
        );
        assert_eq!(
            NewPartner::new("p", None, "short"),
            Err(PartnerError::InvalidWebhookSecret)
        );
        assert_eq!(
            NewPartner::new(" acme ", None, "0123456789abcdef").map(|p| p.name),
            Ok("acme".to_owned())
        );
    }
}
