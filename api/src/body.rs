//! Request bodies: size limit and JSON, with rejections turned into [`ApiError`]s whose
//! message names the problem (axum's text: the serde error and the field's path).
//!
//! JSON is parsed from the raw bytes whatever the `Content-Type` says: the chain monitor's
//! signature covers the exact bytes, and a missing header is not worth refusing a request for.

use axum::{
    body::Bytes,
    extract::{FromRequest, Request, rejection::BytesRejection},
    http::StatusCode,
};
use serde::de::DeserializeOwned;

use crate::ApiError;

/// The raw body: 413 past [`crate::BODY_LIMIT`], 408 when it did not arrive within the
/// body-read timeout.
pub(crate) fn bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else if timed_out(&rejection) {
            ApiError::BodyTimeout
        } else {
            ApiError::BadRequest(rejection.body_text())
        }
    })
}

fn timed_out(rejection: &BytesRejection) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = source {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Parses JSON; malformed JSON, a missing field or a wrong type is a 400 naming it, e.g.
/// `Failed to deserialize the JSON body into the target type: withdrawal_id: invalid type:
/// string "abc", expected u64 at line 1 column 23`.
/// Every body is an object: serde would also read a struct from an array (`[7]`), which no
/// client means.
pub(crate) fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(ApiError::BadRequest(
            "the request body must be a JSON object".to_owned(),
        ));
    }
    axum::Json::<T>::from_bytes(bytes)
        .map(|axum::Json(value)| value)
        .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
}

/// Extractor: a JSON body with the rejections above (admin endpoints).
pub(crate) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = bytes(Bytes::from_request(request, state).await)?;
        json(&body).map(JsonBody)
    }
}
