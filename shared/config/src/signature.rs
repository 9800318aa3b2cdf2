//! HMAC-SHA256 signatures over a timestamp and a body, for webhooks in both directions: the
//! chain monitor signs what it sends us, we sign what we send partners.
//!
//! Header: `X-Paybus-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
//! The timestamp inside the signed text stops a captured request from being replayed later.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const HEADER: &str = "x-paybus-signature";

/// How far a signed timestamp may be from now (either way) before it is refused.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("missing signature header {HEADER}")]
    Missing,
    #[error("malformed signature header: expected t=<unix seconds>,v1=<hex>")]
    Malformed,
    #[error("signature timestamp is {age_secs}s away from now (allowed: {tolerance_secs}s)")]
    Stale { age_secs: i64, tolerance_secs: u64 },
    #[error("signature does not match the body")]
    Mismatch,
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The header value for `body` signed at `timestamp` (unix seconds).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let tag = mac(secret, timestamp, body).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(tag))
}

/// Checks a header value against `body`, in constant time, and the timestamp against `now`.
pub fn verify(
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now: i64,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut timestamp = None;
    let mut signature = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", value)) => timestamp = value.parse::<i64>().ok(),
            Some(("v1", value)) => signature = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(SignatureError::Malformed);
    };
    let age = now.saturating_sub(timestamp);
    let tolerance_secs = tolerance.as_secs();
    if age.unsigned_abs() > tolerance_secs {
        return Err(SignatureError::Stale {
            age_secs: age,
            tolerance_secs,
        });
    }
    mac(secret, timestamp, body)
        .verify_slice(&signature)
        .map_err(|_| SignatureError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_764_460_800;

    #[test]
    fn a_signed_body_verifies() {
        let header = sign(b"secret", NOW, b"{\"a\":1}");
        assert_eq!(
            verify(
                b"secret",
                Some(&header),
                b"{\"a\":1}",
                NOW + 10,
                DEFAULT_TOLERANCE
            ),
            Ok(())
        );
    }

    #[test]
    fn tampering_the_body_or_the_secret_is_a_mismatch() {
        let header = sign(b"secret", NOW, b"{\"a\":1}");
        let v = |secret: &[u8], body: &[u8]| {
            verify(secret, Some(&header), body, NOW, DEFAULT_TOLERANCE)
        };
        assert_eq!(v(b"secret", b"{\"a\":2}"), Err(SignatureError::Mismatch));
        assert_eq!(v(b"other", b"{\"a\":1}"), Err(SignatureError::Mismatch));
    }

    #[test]
    fn an_old_or_future_timestamp_is_stale() {
        let header = sign(b"s", NOW, b"x");
        let late = verify(b"s", Some(&header), b"x", NOW + 301, DEFAULT_TOLERANCE);
        assert!(
            matches!(late, Err(SignatureError::Stale { .. })),
            "{late:?}"
        );
        let early = verify(b"s", Some(&header), b"x", NOW - 301, DEFAULT_TOLERANCE);
        assert!(
            matches!(early, Err(SignatureError::Stale { .. })),
            "{early:?}"
        );
    }

    #[test]
    fn missing_or_garbled_headers_are_refused() {
        let v = |h: Option<&str>| verify(b"s", h, b"x", NOW, DEFAULT_TOLERANCE);
        assert_eq!(v(None), Err(SignatureError::Missing));
        assert_eq!(v(Some("nonsense")), Err(SignatureError::Malformed));
        assert_eq!(v(Some("t=abc,v1=00")), Err(SignatureError::Malformed));
        assert_eq!(
            v(Some(&format!("t={NOW},v1=zz"))),
            Err(SignatureError::Malformed)
        );
    }
}
