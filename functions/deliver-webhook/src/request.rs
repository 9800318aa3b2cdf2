//! One POST to a partner: the signed request, and its result judged as delivered, gone (410) or
//! a failed attempt with a reason fit for `last_error`. The request is signed to the Standard
//! Webhooks specification and, for partners integrated before it, with `X-Paybus-Signature`;
//! docs/webhooks.md ("What a partner receives") shows it header by header.
//!
//! `webhook-id` is the notification's id, equal to `X-Paybus-Notification-Id`: stable across
//! retries and re-deliveries, the partner's idempotency key, since delivery is at least once.
//! `webhook-signature` has one `v1,` entry per unexpired secret (the current one first), so
//! during a rotation's overlap a verifier holding either secret accepts it.
//!
//! Any 2xx is success; 410 Gone disables the endpoint (the notification is parked, not
//! failed); any other status, a timeout or a connection error is a failed attempt. Redirects are
//! not followed (a POST must not turn into a GET somewhere else): a 3xx is a failed attempt too.

use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use paybus_config::signature;
use paybus_telemetry::{TraceHeaders, propagation};
use sha2::Sha256;
use tracing::Instrument;

use paybus_partners::{notifications::ClaimedNotification, webhook_secrets::SigningSecrets};

use crate::config::WebhookConfig;

pub const HEADER_WEBHOOK_ID: &str = "webhook-id";
pub const HEADER_WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_WEBHOOK_SIGNATURE: &str = "webhook-signature";
pub const HEADER_EVENT: &str = "x-paybus-event";
pub const HEADER_NOTIFICATION_ID: &str = "x-paybus-notification-id";
/// The signature header (`shared::signature`).
pub const HEADER_SIGNATURE: &str = signature::HEADER;

/// How much of a refusing partner's response body goes into `last_error`.
const BODY_EXCERPT_BYTES: usize = 300;

/// Builds the one HTTP client of the process (connection pool, TLS, timeouts).
///
/// TLS is rustls with the platform's root certificates; its crypto provider is the process
/// default if one is installed, else reqwest's own (aws-lc-rs).
pub fn client(config: &WebhookConfig) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(config.connect_timeout.min(config.timeout))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("paybus-webhook/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// What one POST came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The partner answered 2xx.
    Delivered { status: u16 },
    /// The partner answered 410 Gone: its endpoint is to be disabled.
    Gone(String),
    /// Anything else, described for `last_error`; the status when an answer came.
    Failed { status: Option<u16>, error: String },
}

impl Attempt {
    /// The HTTP status of the answer, if one came.
    pub fn status(&self) -> Option<u16> {
        match self {
            Attempt::Delivered { status } => Some(*status),
            Attempt::Gone(_) => Some(410),
            Attempt::Failed { status, .. } => *status,
        }
    }

    /// What went wrong, for the attempt's record (None when delivered).
    pub fn error(&self) -> Option<&str> {
        match self {
            Attempt::Delivered { .. } => None,
            Attempt::Gone(error) | Attempt::Failed { error, .. } => Some(error),
        }
    }
}

/// The `webhook-signature` value: `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>` for
/// each of `keys`, separated by spaces (Standard Webhooks).
pub fn standard_signature<'k>(
    keys: impl Iterator<Item = &'k [u8]>,
    webhook_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    keys.map(|key| {
        // HMAC accepts keys of any length.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(webhook_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        )
    })
    .collect::<Vec<_>>()
    .join(" ")
}

/// POSTs the notification, signed at `signed_at` (unix seconds) with `secrets`. Holds no
/// database connection or lock: the caller has committed its claim.
#[tracing::instrument(skip_all, fields(notification_id = notification.id, attempt = notification.attempts))]
pub async fn post(
    client: &reqwest::Client,
    timeout: Duration,
    notification: &ClaimedNotification,
    secrets: &SigningSecrets,
    signed_at: i64,
) -> Attempt {
    let body = notification.payload.as_bytes();
    let webhook_id = notification.id.to_string();
    let span = propagation::http_client_span("webhook", "POST", &notification.webhook_url);
    let mut request = TraceHeaders::of_span(&span)
        .on_request(client.post(&notification.webhook_url))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(HEADER_WEBHOOK_ID, &webhook_id)
        .header(HEADER_WEBHOOK_TIMESTAMP, signed_at.to_string())
        .header(
            HEADER_WEBHOOK_SIGNATURE,
            standard_signature(secrets.all(), &webhook_id, signed_at, body),
        )
        .header(HEADER_EVENT, &notification.event)
        .header(HEADER_NOTIFICATION_ID, &webhook_id);
    if let Some(current) = secrets.current() {
        request = request.header(HEADER_SIGNATURE, signature::sign(current, signed_at, body));
    }
    let sent = request
        .body(notification.payload.clone())
        .send()
        .instrument(span.clone())
        .await;
    if let Ok(response) = &sent {
        span.record(
            "http.response.status_code",
            i64::from(response.status().as_u16()),
        );
    }
    let response = match sent {
        Ok(response) => response,
        Err(error) => {
            return Attempt::Failed {
                status: None,
                error: describe_error(error, timeout),
            };
        }
    };
    let status = response.status();
    if status.is_success() {
        return Attempt::Delivered {
            status: status.as_u16(),
        };
    }
    let excerpt = body_excerpt(response).await;
    let error = if excerpt.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {excerpt}")
    };
    if status == reqwest::StatusCode::GONE {
        return Attempt::Gone(error);
    }
    Attempt::Failed {
        status: Some(status.as_u16()),
        error,
    }
}

/// The first bytes of a response body, as one line of text. A body that cannot be read
/// (timeout, reset) just ends the excerpt: the status already says the attempt failed.
async fn body_excerpt(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < BODY_EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    bytes.truncate(BODY_EXCERPT_BYTES);
    String::from_utf8_lossy(&bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// A transport error as one line: the kind first, then the cause chain. The URL is left out
/// (it may carry credentials); the row already says which partner it was.
fn describe_error(error: reqwest::Error, timeout: Duration) -> String {
    let error = error.without_url();
    if error.is_timeout() {
        return format!("timed out after {timeout:?}");
    }
    let kind = if error.is_connect() {
        "connection failed"
    } else if error.is_builder() {
        "request not sendable (bad webhook_url?)"
    } else {
        "request failed"
    };
    format!("{kind}: {}", paybus_telemetry::one_line(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's test vectors (svix's libraries):
    /// secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id `msg_p5jXN8AQM9LWM0D4loKWxJek`,
    /// timestamp 1614265330, body `{"test": 2432232314}`.
    #[test]
    fn the_standard_signature_matches_the_specifications_example() {
        let key = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap_or_default();
        let signature = standard_signature(
            std::iter::once(key.as_slice()),
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let two = standard_signature([b"a".as_slice(), b"b".as_slice()].into_iter(), "1", 2, b"x");
        assert_eq!(two.split(' ').count(), 2);
    }
}
