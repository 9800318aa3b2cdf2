//! Console actions are admin API calls: sent through the admin router as the session's caller
//! (in the request's extensions, which `auth::require_role` takes instead of a bearer token:
//! the console holds no token), so they pass exactly the checks (role, validation, state
//! guards) and leave exactly the log lines of any other client's call.

use axum::{
    body::Body,
    http::{Method, Request, StatusCode, header},
};
use serde_json::Value;
use tower::ServiceExt;

use super::{Session, layout::Flash};
use crate::{AppState, BODY_LIMIT};

/// What an admin route answered.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
    /// The router has no such route: this build lacks it (e.g. the dead-letter replay API).
    pub(crate) no_route: bool,
}

impl Answer {
    /// The `error` field of an error answer.
    pub(crate) fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("no message")
    }

    /// A flash for a failed call; `None` when it succeeded.
    pub(crate) fn failure(&self, method: &Method, path: &str) -> Option<Flash> {
        if self.no_route {
            Some(Flash::Warn(format!(
                "Not available on this server: {method} {path} answered 404 (this build has no \
                 such admin route). Nothing was changed."
            )))
        } else if !self.status.is_success() {
            Some(Flash::Error(format!(
                "{method} {path} answered {}: {}. Nothing was changed by this call.",
                self.status.as_u16(),
                self.error()
            )))
        } else {
            None
        }
    }
}

/// Sends `method path body` to the admin API as the session's holder.
pub(crate) async fn call(
    state: &AppState,
    session: &Session,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Answer {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .extension(session.caller.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())));
    let request = match request {
        Ok(request) => request,
        Err(error) => return internal(&error),
    };
    let router = crate::admin_routes(state)
        .fallback(crate::no_route)
        .with_state(state.clone());
    let Ok(response) = router.oneshot(request).await;
    let status = response.status();
    let bytes = match axum::body::to_bytes(response.into_body(), BODY_LIMIT * 16).await {
        Ok(bytes) => bytes,
        Err(error) => return internal(&error),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let no_route = status == StatusCode::NOT_FOUND
        && body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with(crate::NO_ROUTE));
    Answer {
        status,
        body,
        no_route,
    }
}

fn internal(error: &dyn std::fmt::Display) -> Answer {
    tracing::error!(%error, "console: the admin call could not be made");
    Answer {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        body: serde_json::json!({"error": "internal error"}),
        no_route: false,
    }
}
