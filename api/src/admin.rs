//! What every admin route shares: the bearer-token guard and path ids.
//!
//! Authentication: `Authorization: Bearer <PAYBUS_ADMIN_TOKEN>`, checked before the body is
//! read. Missing or wrong → 401; token not configured → 503. There is one token and it
//! carries the ADMIN role, so no request here is ever 403 yet; roles come with a token store.

use axum::{
    extract::{Path, Request, State, rejection::PathRejection},
    http::header,
    middleware::Next,
    response::Response,
};

use crate::{ApiError, AppState};

pub(crate) async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(token) = state.admin_token.as_ref() else {
        return Err(ApiError::Disabled(
            "admin API disabled: PAYBUS_ADMIN_TOKEN is not set",
        ));
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match presented {
        None => Err(ApiError::BadToken(
            "missing admin token: send Authorization: Bearer <token>",
        )),
        Some(presented) if constant_time_eq(presented.as_bytes(), token.expose().as_bytes()) => {
            Ok(next.run(request).await)
        }
        Some(_) => {
            tracing::warn!(path = %request.uri().path(), "admin request with a wrong token");
            Err(ApiError::BadToken("invalid admin token"))
        }
    }
}

/// Compares without stopping at the first differing byte (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A `{id}` path segment: a positive integer, else 400.
pub(crate) fn path_id(path: Result<Path<u64>, PathRejection>) -> Result<u64, ApiError> {
    match path {
        Ok(Path(id)) if id > 0 => Ok(id),
        _ => Err(ApiError::BadRequest(
            "the id in the path must be a positive integer".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_by_content_and_length() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
