//! The API's one error type. A client mistake answers with a message that names the problem;
//! an internal fault answers `500 {"error": "internal error"}` and logs its cause chain, so no
//! SQL, hostname or driver text ever reaches a response.

use std::net::SocketAddr;

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use paybus_bonuses::BonusError;
use paybus_bus::outbox::OutboxError;
use paybus_confirmations::CreateError;
use paybus_db as db;
use serde_json::json;

/// How long a client should wait after a 503 from a database outage.
const RETRY_AFTER_SECS: &str = "5";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed JSON, a missing or ill-typed field, a value out of range.
    #[error("{0}")]
    BadRequest(String),
    /// 401: a missing, malformed, stale or wrong webhook signature.
    #[error("{0}")]
    BadSignature(String),
    /// 401 with `WWW-Authenticate: Bearer`: a missing, malformed, tampered or expired admin
    /// token.
    #[error("{0}")]
    BadToken(&'static str),
    /// 401 with `WWW-Authenticate: Bearer realm="paybus-partner"`: a missing, malformed,
    /// unknown, revoked or expired partner API key.
    #[error("{0}")]
    BadPartnerKey(&'static str),
    /// 422: the request is well-formed but cannot be honoured as sent (an `Idempotency-Key`
    /// reused with another request).
    #[error("{0}")]
    Unprocessable(String),
    /// 403: a valid token without the role this request needs.
    #[error("this request needs the {0} role")]
    Forbidden(crate::role::Role),
    /// 403: the token has the role, but its subject may not do this (four-eyes: approving
    /// one's own request).
    #[error("{0}")]
    NotYours(String),
    /// 404: the row (or the route) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409: the request conflicts with a row that exists.
    #[error("{0}")]
    Conflict(String),
    /// 413: the body is larger than [`crate::BODY_LIMIT`].
    #[error("request body is larger than {limit} bytes", limit = crate::BODY_LIMIT)]
    PayloadTooLarge,
    /// 408: the body did not arrive within the body-read timeout.
    #[error("the request body did not arrive in time")]
    BodyTimeout,
    /// 503: the endpoint is switched off because its secret is not configured.
    #[error("{0}")]
    Disabled(&'static str),
    /// 503 with `Retry-After`: the process is listening but not ready yet (what it waits for).
    #[error("paybus is starting: {0}")]
    Starting(String),

    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// Any other fault of ours (e.g. a row the domain cannot read).
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("outbox error")]
    Outbox(#[from] OutboxError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP server failed")]
    Serve(#[source] std::io::Error),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::BadSignature(_) | ApiError::BadToken(_) | ApiError::BadPartnerKey(_) => {
                StatusCode::UNAUTHORIZED
            }
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Forbidden(_) | ApiError::NotYours(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            // The database is down or overloaded: the client should retry (the chain monitor
            // re-sends anyway), not be told its request was wrong or broke us.
            ApiError::Database(e) | ApiError::Outbox(OutboxError::Database(e))
                if db::is_unavailable(e) =>
            {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Disabled(_) | ApiError::Starting(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Database(_)
            | ApiError::Internal(_)
            | ApiError::Outbox(_)
            | ApiError::Bind { .. }
            | ApiError::Serve(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// `self: cause: cause ...`, for the log.
    pub fn cause_chain(&self) -> String {
        paybus_telemetry::one_line(self)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let unavailable = matches!(self, ApiError::Database(_) | ApiError::Outbox(_))
            && status == StatusCode::SERVICE_UNAVAILABLE;
        let message = if unavailable {
            tracing::warn!(error = %self.cause_chain(), "request refused: database unavailable");
            "the database is unavailable; retry later".to_owned()
        } else if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            tracing::error!(error = %self.cause_chain(), "request failed");
            "internal error".to_owned()
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request refused");
            self.to_string()
        };
        let mut response = (status, Json(json!({ "error": message }))).into_response();
        if unavailable || matches!(self, ApiError::Starting(_)) {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        if matches!(self, ApiError::BadToken(_)) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"paybus-admin\""),
            );
        }
        if matches!(self, ApiError::BadPartnerKey(_)) {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"paybus-partner\""),
            );
        }
        response
    }
}

impl From<CreateError> for ApiError {
    fn from(error: CreateError) -> Self {
        match error {
            CreateError::UnknownPartner(_) => ApiError::NotFound(error.to_string()),
            CreateError::NotInitial => ApiError::BadRequest(error.to_string()),
            CreateError::DuplicateActive { .. } => ApiError::Conflict(error.to_string()),
            CreateError::Database(e) => ApiError::Database(e),
        }
    }
}

/// A database fault stays one (503 while the database is unavailable, else 500); anything else
/// the bonus domain cannot read is ours: 500 without details.
impl From<BonusError> for ApiError {
    fn from(error: BonusError) -> Self {
        match error {
            BonusError::Database(e) => ApiError::Database(e),
            BonusError::Outbox(e) => ApiError::Outbox(e),
            other => ApiError::Internal(Box::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_internal_error_answers_500_without_its_cause() {
        let error = ApiError::Database(sqlx::Error::Protocol(
            "secret host db-7.internal refused".into(),
        ));
        assert!(error.cause_chain().contains("db-7.internal"));
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .expect("body");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).expect("json"),
            json!({"error": "internal error"})
        );
    }

    #[tokio::test]
    async fn a_client_error_answers_with_its_message() {
        let response = ApiError::BadRequest("amount: not a decimal".into()).into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .expect("body");
        assert_eq!(&body[..], br#"{"error":"amount: not a decimal"}"#);
    }

    #[tokio::test]
    async fn a_database_outage_is_503_with_retry_after() {
        let response = ApiError::Database(sqlx::Error::PoolTimedOut).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from_static("5"))
        );
        // A statement the database refuses for good is still ours: 500.
        let refused = ApiError::Database(sqlx::Error::RowNotFound).into_response();
        assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_bad_token_carries_a_bearer_challenge() {
        let response = ApiError::BadToken("missing").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(response.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}
