//! One POST to a partner: the signed request, and its result judged as delivered or as a
//! failed attempt with a reason fit for `last_error`.
//!
//! The request partners receive:
//!
//! ```text
//! POST <partners.webhook_url>
//! Content-Type: application/json
//! X-Paybus-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(webhook_secret, "<t>.<body>")>
//! X-Paybus-Event: WITHDRAWAL_CONFIRMED
//! X-Paybus-Notification-Id: 1234
//!
//! <partner_notifications.payload, byte for byte>
//! ```
//!
//! Delivery is at least once: a partner can see the same notification again (a 2xx whose
//! settle was lost, a lease that ran out mid-request), always with the same
//! `X-Paybus-Notification-Id`, which is the partner's idempotency key. Any 2xx is success;
//! every other status, a timeout or a connection error is a failed attempt. Redirects are not
//! followed (a POST must not turn into a GET somewhere else): a 3xx is a failed attempt too.

use std::time::Duration;

use paybus_platform::signature;

use paybus_partners::notifications::ClaimedNotification;

use crate::config::WebhookConfig;

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
    /// Anything else, described for `last_error`.
    Failed(String),
}

/// POSTs the notification, signed at `signed_at` (unix seconds). Holds no database
/// connection or lock: the caller has committed its claim.
#[tracing::instrument(skip_all, fields(notification_id = notification.id, attempt = notification.attempts))]
pub async fn post(
    client: &reqwest::Client,
    timeout: Duration,
    notification: &ClaimedNotification,
    signed_at: i64,
) -> Attempt {
    let body = notification.payload.as_bytes();
    let signature = signature::sign(notification.webhook_secret.as_bytes(), signed_at, body);
    let sent = client
        .post(&notification.webhook_url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(HEADER_SIGNATURE, signature)
        .header(HEADER_EVENT, &notification.event)
        .header(HEADER_NOTIFICATION_ID, notification.id.to_string())
        .body(notification.payload.clone())
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(error) => return Attempt::Failed(describe_error(error, timeout)),
    };
    let status = response.status();
    if status.is_success() {
        return Attempt::Delivered {
            status: status.as_u16(),
        };
    }
    let excerpt = body_excerpt(response).await;
    Attempt::Failed(if excerpt.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {excerpt}")
    })
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
    format!("{kind}: {}", paybus_platform::telemetry::one_line(&error))
}
