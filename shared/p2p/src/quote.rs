//! The quote service client (the seeds' TORQ `getQuote` / `createTrade`): real HTTP with
//! connect and request timeouts, called with **no transaction open and no row locked**
//! (principle 3, seed 000 §0: the incident was this call made under `FOR UPDATE`).
//!
//! ```text
//! POST {base}/v1/quotes   {"currency": "USDT", "amount": "100", "reference": "p2p-deposit-7"}
//!   200 {"quote_id": "q-1", "rate": "1391.5", "fee": "0.5"}
//! POST {base}/v1/trades   Idempotency-Key: p2p-deposit-7-fill-1
//!                         {"quote_id": "q-1", "currency": "USDT", "amount": "100", "reference": "p2p-deposit-7"}
//!   200 {"trade_id": "t-1"}
//! ```
//!
//! Amounts are JSON strings (exact decimals). The idempotency key names the trade, not the
//! request: one fill of one deposit order has one key however often it is tried, so a retry
//! after a timeout, a crash or a lost settle gets the trade already made instead of a second
//! one. Any non-2xx answer, a timeout, a refused connection or an answer that does not parse
//! is a failed call; the attempt that made it releases its reservation and counts a failure.

use std::time::Duration;

use paybus_money::Amount;
use paybus_platform::Secret;
use serde::{Deserialize, Serialize};
use url::Url;

use crate::config::QuoteConfig;

/// The header that carries a trade's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// How much of a refusing answer goes into the error.
const BODY_EXCERPT_CHARS: usize = 300;
/// `p2p_matches.external_trade_id` is a VARCHAR(128).
const TRADE_ID_MAX: usize = 128;

/// Which call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display)]
pub enum Call {
    #[strum(serialize = "getQuote")]
    GetQuote,
    #[strum(serialize = "createTrade")]
    CreateTrade,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuoteError {
    #[error("the quote service is not configured (PAYBUS_QUOTE_URL is not set)")]
    NotConfigured,
    #[error("quote service {call} timed out after {timeout:?}")]
    Timeout { call: Call, timeout: Duration },
    #[error("quote service {call}: connection failed: {detail}")]
    Connect { call: Call, detail: String },
    #[error("quote service {call} answered HTTP {status}: {body}")]
    Status {
        call: Call,
        status: u16,
        body: String,
    },
    #[error("quote service {call} answered something unusable: {detail}")]
    Invalid { call: Call, detail: String },
}

/// A price for an amount, to be traded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Quote {
    pub quote_id: String,
    pub rate: Amount,
    pub fee: Amount,
}

/// The trade the quote service made (or had made already, for this key).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Trade {
    pub trade_id: String,
}

/// One fill to trade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TradeRequest<'a> {
    pub currency: &'a str,
    pub amount: Amount,
    /// Names the deposit order at the quote service (for its logs and support).
    pub reference: String,
    /// The fill's idempotency key.
    pub key: &'a str,
}

#[derive(Serialize)]
struct QuoteBody<'a> {
    currency: &'a str,
    amount: Amount,
    reference: &'a str,
}

#[derive(Serialize)]
struct TradeBody<'a> {
    quote_id: &'a str,
    currency: &'a str,
    amount: Amount,
    reference: &'a str,
}

/// The client: build it once per process (it owns the connection pool).
#[derive(Debug, Clone)]
pub struct QuoteClient {
    http: reqwest::Client,
    quotes: Url,
    trades: Url,
    api_key: Option<Secret>,
    timeout: Duration,
}

impl QuoteClient {
    /// `None` when no URL is configured.
    pub fn new(config: &QuoteConfig) -> Result<Option<Self>, reqwest::Error> {
        let Some(base) = &config.url else {
            return Ok(None);
        };
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout.min(config.timeout))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("paybus-p2p/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Some(Self {
            http,
            quotes: endpoint(base, "v1/quotes"),
            trades: endpoint(base, "v1/trades"),
            api_key: config.api_key.clone(),
            timeout: config.timeout,
        }))
    }

    /// `getQuote`, then `createTrade` with the fill's key: the trade of one fill.
    #[tracing::instrument(skip_all, fields(key = request.key, amount = %request.amount))]
    pub async fn trade(&self, request: &TradeRequest<'_>) -> Result<(Quote, Trade), QuoteError> {
        let quote: Quote = self
            .post(
                Call::GetQuote,
                &self.quotes,
                &QuoteBody {
                    currency: request.currency,
                    amount: request.amount,
                    reference: &request.reference,
                },
                None,
            )
            .await?;
        if quote.quote_id.trim().is_empty() {
            return Err(invalid(Call::GetQuote, "an empty quote_id"));
        }
        if !quote.rate.is_positive() {
            return Err(invalid(Call::GetQuote, format!("rate {}", quote.rate)));
        }
        if quote.fee.is_negative() || quote.fee > request.amount {
            return Err(invalid(
                Call::GetQuote,
                format!("fee {} for an amount of {}", quote.fee, request.amount),
            ));
        }
        let trade: Trade = self
            .post(
                Call::CreateTrade,
                &self.trades,
                &TradeBody {
                    quote_id: &quote.quote_id,
                    currency: request.currency,
                    amount: request.amount,
                    reference: &request.reference,
                },
                Some(request.key),
            )
            .await?;
        let id = trade.trade_id.trim();
        if id.is_empty() || id.chars().count() > TRADE_ID_MAX {
            return Err(invalid(
                Call::CreateTrade,
                format!("trade_id {:?}", trade.trade_id),
            ));
        }
        Ok((quote, trade))
    }

    async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        call: Call,
        url: &Url,
        body: &impl Serialize,
        idempotency_key: Option<&str>,
    ) -> Result<T, QuoteError> {
        let mut request = self.http.post(url.clone()).json(body);
        if let Some(key) = idempotency_key {
            request = request.header(IDEMPOTENCY_KEY, key);
        }
        if let Some(api_key) = &self.api_key {
            request = request.bearer_auth(api_key.expose());
        }
        let response = request.send().await.map_err(|e| self.transport(call, e))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(QuoteError::Status {
                call,
                status: status.as_u16(),
                body: excerpt(&text),
            });
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| self.transport(call, e))?;
        serde_json::from_slice(&bytes).map_err(|e| invalid(call, e.to_string()))
    }

    /// A transport error as one line; the URL is left out (the configuration names it).
    fn transport(&self, call: Call, error: reqwest::Error) -> QuoteError {
        let error = error.without_url();
        if error.is_timeout() {
            return QuoteError::Timeout {
                call,
                timeout: self.timeout,
            };
        }
        QuoteError::Connect {
            call,
            detail: paybus_platform::telemetry::one_line(&error),
        }
    }
}

fn invalid(call: Call, detail: impl Into<String>) -> QuoteError {
    QuoteError::Invalid {
        call,
        detail: detail.into(),
    }
}

/// `base` + `path`, whether or not `base` ends with a slash.
fn endpoint(base: &Url, path: &str) -> Url {
    let mut url = base.clone();
    if !url.path().ends_with('/') {
        let with_slash = format!("{}/", url.path());
        url.set_path(&with_slash);
    }
    url.join(path).unwrap_or_else(|_| base.clone())
}

fn excerpt(text: &str) -> String {
    text.chars()
        .take(BODY_EXCERPT_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn endpoints_hang_under_the_base_path() {
        for base in ["https://torq.example.com", "https://torq.example.com/"] {
            let base = Url::parse(base).unwrap();
            assert_eq!(
                endpoint(&base, "v1/quotes").as_str(),
                "https://torq.example.com/v1/quotes"
            );
        }
        let nested = Url::parse("https://gw.example.com/torq").unwrap();
        assert_eq!(
            endpoint(&nested, "v1/trades").as_str(),
            "https://gw.example.com/torq/v1/trades"
        );
    }

    #[test]
    fn no_url_means_no_client() {
        assert!(QuoteClient::new(&QuoteConfig::default()).unwrap().is_none());
    }

    #[test]
    fn excerpts_are_one_bounded_line() {
        let long = format!("line one\nline two {}", "x".repeat(500));
        let text = excerpt(&long);
        assert!(!text.contains('\n'));
        assert_eq!(text.chars().count(), BODY_EXCERPT_CHARS);
    }
}
