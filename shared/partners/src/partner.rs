//! The `partners` row: who a partner is and where its webhooks go.

use chrono::{DateTime, Utc};
use paybus_config::redact;
use paybus_config::sealed::Sealer;
use paybus_ops::actor::Actor;
use paybus_ops::ops_log::{self, Entry};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection};

use crate::{
    breaker::{BreakerRead, BreakerState},
    webhook_secrets::{self, RevealedSecret, SecretKey, WebhookSecretError},
};

/// A partner as it may be shown: the webhook secret is never read back out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partner {
    pub id: u64,
    pub name: String,
    pub webhook_url: Option<String>,
    /// The circuit breaker of webhook delivery to this partner.
    pub webhook_breaker: BreakerView,
    /// Set when the endpoint answered 410 Gone: its deliveries are parked until the URL is
    /// set again ([`set_webhook_url`]).
    pub webhook_disabled: Option<DisabledView>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A partner's breaker as ops see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerView {
    pub state: BreakerState,
    pub consecutive_failures: u32,
    /// Since when it has been open or half-open (the failure that opened it).
    pub opened_at: Option<DateTime<Utc>>,
    /// Until when deliveries are parked (open), or since when a probe may go (half-open).
    pub open_until: Option<DateTime<Utc>>,
}

/// A disabled endpoint as ops see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DisabledView {
    pub since: DateTime<Utc>,
    pub reason: Option<String>,
}

#[derive(sqlx::FromRow)]
struct PartnerRow {
    id: u64,
    name: String,
    webhook_url: Option<String>,
    webhook_failures: u32,
    webhook_open_until: Option<DateTime<Utc>>,
    webhook_opened_at: Option<DateTime<Utc>>,
    webhook_disabled_at: Option<DateTime<Utc>>,
    webhook_disabled_reason: Option<String>,
    now: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// A partner to create, validated by [`NewPartner::new`].
#[derive(Clone, PartialEq, Eq)]
pub struct NewPartner {
    name: String,
    webhook_url: Option<String>,
    /// The key given by the admin; `None`: [`create`] generates one.
    webhook_secret: Option<SecretKey>,
}

impl std::fmt::Debug for NewPartner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewPartner")
            .field("name", &self.name)
            .field(
                "webhook_url",
                &self.webhook_url.as_deref().map(redact::text),
            )
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "***"),
            )
            .finish()
    }
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
    #[error(
        "webhook_secret must be a whsec_<base64> secret or a string of 16 to 255 bytes, or \
         absent (one is generated)"
    )]
    InvalidWebhookSecret,
}

pub const NAME_MAX_CHARS: usize = 190;
pub const WEBHOOK_URL_MAX_CHARS: usize = 2000;

impl NewPartner {
    /// `webhook_secret`: a `whsec_<base64>` secret, a legacy string of 16 to 255 bytes (its
    /// bytes are the key), or `None` to have one generated.
    pub fn new(
        name: &str,
        webhook_url: Option<&str>,
        webhook_secret: Option<&str>,
    ) -> Result<Self, PartnerError> {
        let name = name.trim();
        if name.is_empty() {
            return Err(PartnerError::EmptyName);
        }
        if name.chars().count() > NAME_MAX_CHARS {
            return Err(PartnerError::NameTooLong);
        }
        let webhook_url = webhook_url.map(parse_webhook_url).transpose()?;
        let webhook_secret = webhook_secret
            .map(webhook_secrets::parse)
            .transpose()
            .map_err(|webhook_secrets::InvalidSecret| PartnerError::InvalidWebhookSecret)?;
        Ok(Self {
            name: name.to_owned(),
            webhook_url,
            webhook_secret,
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

/// A partner just created.
#[derive(Debug)]
pub struct Created {
    pub id: u64,
    /// The secret [`create`] generated, to show once; `None` when the admin gave one.
    pub webhook_secret: Option<RevealedSecret>,
}

/// Inserts the partner with its webhook secret sealed (generated when none was given) and
/// logs its creation in the ops log (`partner.create`, by `actor`: its name and webhook URL
/// with any password hidden, never the secret), in one transaction.
pub async fn create(
    conn: &mut MySqlConnection,
    sealer: &Sealer,
    new: &NewPartner,
    actor: &Actor,
) -> Result<Created, WebhookSecretError> {
    let (key, revealed) = match &new.webhook_secret {
        Some(key) => (key.clone(), None),
        None => {
            let (key, revealed) = webhook_secrets::generate()?;
            (key, Some(revealed))
        }
    };
    let mut tx = conn.begin().await?;
    let id = sqlx::query("INSERT INTO partners (name, webhook_url) VALUES (?, ?)")
        .bind(&new.name)
        .bind(&new.webhook_url)
        .execute(&mut *tx)
        .await?
        .last_insert_id();
    webhook_secrets::insert(&mut tx, sealer, id, &key).await?;
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
    Ok(Created {
        id,
        webhook_secret: revealed,
    })
}

/// Sets (or, with `None`, clears) the partner's webhook URL, validated as [`NewPartner::new`]
/// validates it. Re-enables an endpoint disabled by a 410 and makes the partner's parked
/// PENDING notifications due now (their messages come from the due sweep), in one
/// transaction with its ops-log entry (`partner.webhook_url.set`). False when there is no
/// such partner.
pub async fn set_webhook_url(
    conn: &mut MySqlConnection,
    partner_id: u64,
    url: Option<&str>,
    actor: &Actor,
) -> Result<bool, SetWebhookUrlError> {
    let url = url.map(parse_webhook_url).transpose()?;
    let mut tx = conn.begin().await?;
    let was: Option<(Option<DateTime<Utc>>,)> =
        sqlx::query_as("SELECT webhook_disabled_at FROM partners WHERE id = ? FOR UPDATE")
            .bind(partner_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((disabled_at,)) = was else {
        return Ok(false);
    };
    sqlx::query(
        "UPDATE partners SET webhook_url = ?, webhook_disabled_at = NULL, \
         webhook_disabled_reason = NULL WHERE id = ?",
    )
    .bind(&url)
    .bind(partner_id)
    .execute(&mut *tx)
    .await?;
    // Only a disabled endpoint has rows parked far out. A delivery in flight to it when it
    // was disabled may be sent once more: at least once, under the same webhook-id.
    let released = if disabled_at.is_some() {
        sqlx::query(
            "UPDATE partner_notifications SET next_attempt_at = NOW(6), republished_at = NULL \
             WHERE partner_id = ? AND status = 'PENDING' AND next_attempt_at > NOW(6)",
        )
        .bind(partner_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    } else {
        0
    };
    ops_log::append(
        &mut tx,
        &Entry {
            actor,
            action: "partner.webhook_url.set",
            subject: &format!("partner:{partner_id}"),
            detail: &serde_json::json!({
                "webhook_url": url.as_deref().map(redact::text),
                "re_enabled": disabled_at.is_some(),
                "notifications_released": released,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Why [`set_webhook_url`] did not set the URL.
#[derive(Debug, thiserror::Error)]
pub enum SetWebhookUrlError {
    #[error(transparent)]
    Invalid(#[from] PartnerError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

const PARTNER_COLUMNS: &str = "id, name, webhook_url, webhook_failures, webhook_open_until, \
     webhook_opened_at, webhook_disabled_at, webhook_disabled_reason, NOW(6) AS now, \
     created_at, updated_at";

pub async fn find(conn: &mut MySqlConnection, id: u64) -> Result<Option<Partner>, sqlx::Error> {
    let row: Option<PartnerRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {PARTNER_COLUMNS} FROM partners WHERE id = ?"
    )))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(Partner::from))
}

/// Up to `limit` partners with an id above `after_id`, by id.
pub async fn list(
    conn: &mut MySqlConnection,
    after_id: u64,
    limit: u32,
) -> Result<Vec<Partner>, sqlx::Error> {
    let rows: Vec<PartnerRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {PARTNER_COLUMNS} FROM partners WHERE id > ? ORDER BY id LIMIT ?"
    )))
    .bind(after_id)
    .bind(limit)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(Partner::from).collect())
}

impl From<PartnerRow> for Partner {
    fn from(row: PartnerRow) -> Self {
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
                opened_at: row.webhook_opened_at,
                open_until: breaker.open_until,
            },
            webhook_disabled: row.webhook_disabled_at.map(|since| DisabledView {
                since,
                reason: row.webhook_disabled_reason,
            }),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_absolute_http() {
        let with = |url| NewPartner::new("p", Some(url), None);
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
            NewPartner::new("  ", None, Some("0123456789abcdef")),
            Err(PartnerError::EmptyName)
        );
        assert_eq!(
            NewPartner::new(&"n".repeat(191), None, Some("0123456789abcdef")),
            Err(PartnerError::NameTooLong)
        );
        assert_eq!(
            NewPartner::new("p", None, Some("short")),
            Err(PartnerError::InvalidWebhookSecret)
        );
        assert_eq!(
            NewPartner::new(" acme ", None, Some("0123456789abcdef")).map(|p| p.name),
            Ok("acme".to_owned())
        );
    }
}
