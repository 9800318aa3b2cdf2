//! `POST /v1/admin/partners`, `GET /v1/admin/partners/{id}`. The webhook secret is write-only:
//! it is never returned.

use axum::{
    Json,
    extract::{Path, State, rejection::PathRejection},
    http::StatusCode,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{path_id, text};
use crate::{ApiError, AppState, body::JsonBody};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewPartner {
    name: String,
    /// Where deliver-webhook POSTs this partner's notifications; absent: no webhooks.
    #[serde(default)]
    webhook_url: Option<String>,
    webhook_secret: String,
}

#[tracing::instrument(skip_all, fields(partner_id))]
pub(super) async fn create(
    State(state): State<AppState>,
    JsonBody(new): JsonBody<NewPartner>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let name = text("name", &new.name, 190)?;
    let webhook_url = new.webhook_url.as_deref().map(webhook_url).transpose()?;
    if new.webhook_secret.len() < 16 || new.webhook_secret.len() > 255 {
        return Err(ApiError::BadRequest(
            "webhook_secret must be 16 to 255 bytes long".to_owned(),
        ));
    }
    let id =
        sqlx::query("INSERT INTO partners (name, webhook_url, webhook_secret) VALUES (?, ?, ?)")
            .bind(&name)
            .bind(&webhook_url)
            .bind(&new.webhook_secret)
            .execute(&state.pool)
            .await?
            .last_insert_id();
    tracing::Span::current().record("partner_id", id);
    tracing::info!(partner_id = id, %name, "partner created");
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

fn webhook_url(raw: &str) -> Result<String, ApiError> {
    let invalid = || {
        ApiError::BadRequest(
            "webhook_url must be an absolute http:// or https:// URL of at most 2000 characters"
                .to_owned(),
        )
    };
    let url = url::Url::parse(raw.trim()).map_err(|_| invalid())?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() || raw.len() > 2000 {
        return Err(invalid());
    }
    Ok(url.to_string())
}

#[derive(Debug, Serialize, sqlx::FromRow)]
pub(super) struct Partner {
    id: u64,
    name: String,
    webhook_url: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

pub(super) async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Partner>, ApiError> {
    let id = path_id(id)?;
    sqlx::query_as::<_, Partner>(
        "SELECT id, name, webhook_url, created_at, updated_at FROM partners WHERE id = ?",
    )
    .bind(id)
    .fetch_optional(&state.pool)
    .await?
    .map(Json)
    .ok_or_else(|| ApiError::NotFound(format!("partner {id} not found")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_are_absolute_http() {
        assert_eq!(
            webhook_url("https://partner.example/hooks").unwrap(),
            "https://partner.example/hooks"
        );
        assert!(webhook_url("http://127.0.0.1:9000/x").is_ok());
        assert!(webhook_url("ftp://partner.example/").is_err());
        assert!(webhook_url("/relative").is_err());
        assert!(webhook_url("not a url").is_err());
    }
}
