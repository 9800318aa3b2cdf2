//! Requests another system signs with a secret it shares with us (`X-Paybus-Signature:
//! t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`, see
//! `paybus_config::signature`): the chain monitor's confirmations and the payment gateways'
//! completions. One check for both.
//!
//! Order: the route is enabled (503 while its secret is unset) → the body fits (413) → the
//! signature is there, well-formed, fresh (±300 s) and right (401). A refusal never reaches
//! the database.

use axum::{body::Bytes, extract::rejection::BytesRejection, http::HeaderMap};
use paybus_config::{
    Secret,
    signature::{self, SignatureError},
};

use crate::{ApiError, AppState, body};

/// Who signs a route's requests.
pub(crate) struct Signer {
    /// For the log line of a refused request (e.g. "chain-monitor").
    pub(crate) name: &'static str,
    /// The answer while the secret is unset (503).
    pub(crate) disabled: &'static str,
}

/// The body of a request signed with `secret`, or why it is refused.
pub(crate) fn verified_body(
    state: &AppState,
    signer: &Signer,
    secret: Option<&Secret>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    let secret = secret.ok_or(ApiError::Disabled(signer.disabled))?;
    let body = body::bytes(body)?;
    // A header that is not even visible ASCII cannot be a valid signature: verify() calls it
    // malformed.
    let header = headers
        .get(signature::HEADER)
        .map(|value| value.to_str().unwrap_or(""));
    let now = chrono::Utc::now().timestamp();
    signature::verify(
        secret.expose().as_bytes(),
        header,
        &body,
        now,
        state.signature_tolerance,
    )
    .map_err(|error| {
        tracing::warn!(signer = signer.name, %error, "signed request refused");
        ApiError::BadSignature(match error {
            SignatureError::Missing => "missing X-Paybus-Signature header".to_owned(),
            SignatureError::Stale { .. } => format!("stale signature: {error}"),
            SignatureError::Malformed | SignatureError::Mismatch => {
                format!("invalid signature: {error}")
            }
        })
    })?;
    Ok(body)
}
