//! The quote service client (the seeds' TORQ `getQuote` / `createTrade`, and the trade lookups
//! reconciliation needs): real HTTP with connect and request timeouts, called with **no
//! transaction open and no row locked** (seed 000 §0). The HTTP contract TORQ must offer (the
//! `testing` stub implements it) is in docs/workflows/p2p.md ("The quote service's contract").
//!
//! Every failed call says what it leaves behind at the service ([`QuoteError::effect`],
//! principle 12); a quote and a lookup have no side effect, so theirs is always "not done":
//!
//! | failure | createTrade |
//! | --- | --- |
//! | connection refused, DNS, TLS, connect timeout (nothing was sent) | **not done** |
//! | a 4xx other than 408, 409, 425 (a definitive refusal of the request) | **not done** |
//! | 408, 409 (key in use / reused), 425, any 5xx; a timeout or a reset after the request was written; a 2xx that does not parse, or a trade for another amount | **unknown** |
//!
//! An unknown createTrade is resolved only by asking again under the same key, never released.

use std::time::Duration;

use chrono::{DateTime, Utc};
use paybus_bus::metrics;
use paybus_config::Secret;
use paybus_money::Amount;
use paybus_telemetry::{TraceHeaders, propagation};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use url::Url;

use crate::config::QuoteConfig;

/// The header that carries a trade's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// How much of a refusing answer goes into the error.
const BODY_EXCERPT_CHARS: usize = 300;
/// `p2p_matches.external_trade_id` and `quote_id` are VARCHAR(128).
const ID_MAX: usize = 128;
/// Trades asked for per page of a listing.
const PAGE: u32 = 500;

/// Which call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display, strum::IntoStaticStr)]
pub enum Call {
    #[strum(serialize = "getQuote")]
    GetQuote,
    #[strum(serialize = "createTrade")]
    CreateTrade,
    #[strum(serialize = "listTrades")]
    ListTrades,
}

pub use metrics::Effect;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuoteError {
    #[error("the quote service is not configured (PAYBUS_QUOTE_URL is not set)")]
    NotConfigured,
    /// Connecting failed or timed out: nothing was sent.
    #[error("quote service {call}: could not connect: {detail}")]
    Connect { call: Call, detail: String },
    /// The request was (or may have been) written, and no answer came in time.
    #[error("quote service {call} timed out after {timeout:?}")]
    Timeout { call: Call, timeout: Duration },
    /// The connection failed after the request was (or may have been) written.
    #[error("quote service {call}: the connection failed without an answer: {detail}")]
    Transport { call: Call, detail: String },
    #[error("quote service {call} answered HTTP {status}: {body}")]
    Status {
        call: Call,
        status: u16,
        body: String,
    },
    #[error("quote service {call} answered something unusable: {detail}")]
    Invalid { call: Call, detail: String },
}

impl QuoteError {
    pub fn call(&self) -> Option<Call> {
        match self {
            QuoteError::NotConfigured => None,
            QuoteError::Connect { call, .. }
            | QuoteError::Timeout { call, .. }
            | QuoteError::Transport { call, .. }
            | QuoteError::Status { call, .. }
            | QuoteError::Invalid { call, .. } => Some(*call),
        }
    }

    /// What the failed call leaves behind at the quote service (the module's table).
    pub fn effect(&self) -> Effect {
        if self.call() != Some(Call::CreateTrade) {
            return Effect::NotDone;
        }
        match self {
            QuoteError::NotConfigured | QuoteError::Connect { .. } => Effect::NotDone,
            QuoteError::Status { status, .. } if is_refusal(*status) => Effect::NotDone,
            QuoteError::Status { .. }
            | QuoteError::Timeout { .. }
            | QuoteError::Transport { .. }
            | QuoteError::Invalid { .. } => Effect::Unknown,
        }
    }
}

/// A 4xx that refuses the request as such: nothing was done. 408 (the service gave up reading
/// it), 409 (the key is in use, or was used with another body) and 425 (too early to replay)
/// say nothing about a trade made under the key.
fn is_refusal(status: u16) -> bool {
    (400..500).contains(&status) && !matches!(status, 408 | 409 | 425)
}

/// A price for an amount, to be traded.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Quote {
    pub quote_id: String,
    pub rate: Amount,
    pub fee: Amount,
}

/// The trade the quote service made (or had made already, for this key), with its terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trade {
    pub trade_id: String,
    pub rate: Amount,
    pub fee: Amount,
}

#[derive(Deserialize)]
struct TradeAnswer {
    trade_id: String,
    #[serde(default)]
    amount: Option<Amount>,
    #[serde(default)]
    rate: Option<Amount>,
    #[serde(default)]
    fee: Option<Amount>,
}

/// A trade as the quote service's listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct TradeRecord {
    pub trade_id: String,
    pub idempotency_key: String,
    #[serde(default)]
    pub reference: Option<String>,
    pub currency: String,
    pub amount: Amount,
    #[serde(default)]
    pub rate: Option<Amount>,
    #[serde(default)]
    pub fee: Option<Amount>,
    pub created_at: DateTime<Utc>,
}

#[derive(Deserialize)]
struct TradePage {
    trades: Vec<TradeRecord>,
    #[serde(default)]
    next_after: Option<String>,
}

/// What to ask a quote for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuoteRequest<'a> {
    pub currency: &'a str,
    pub amount: Amount,
    /// Names the deposit order at the quote service (for its logs and support).
    pub reference: &'a str,
}

/// One fill to trade: the same body every time its key is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TradeRequest<'a> {
    pub quote_id: &'a str,
    pub currency: &'a str,
    pub amount: Amount,
    pub reference: &'a str,
    /// The fill's idempotency key (a header, not the body).
    #[serde(skip)]
    pub key: &'a str,
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

    /// `getQuote`: a price for the amount (no side effect).
    #[tracing::instrument(skip_all, fields(reference = request.reference, amount = %request.amount))]
    pub async fn quote(&self, request: &QuoteRequest<'_>) -> Result<Quote, QuoteError> {
        let quote: Quote = self
            .send(Call::GetQuote, self.post(&self.quotes, request))
            .await?;
        if quote.quote_id.trim().is_empty() || quote.quote_id.chars().count() > ID_MAX {
            return Err(invalid(
                Call::GetQuote,
                format!("quote_id {:?}", quote.quote_id),
            ));
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
        Ok(quote)
    }

    /// `createTrade` under the fill's key. `quote` supplies the terms an answer leaves out.
    /// Every call is counted by its [`Effect`] in `/metrics`.
    #[tracing::instrument(skip_all, fields(key = request.key, amount = %request.amount))]
    pub async fn create_trade(
        &self,
        request: &TradeRequest<'_>,
        quote: &Quote,
    ) -> Result<Trade, QuoteError> {
        let traded = self.create_trade_unrecorded(request, quote).await;
        let effect = match &traded {
            Ok(_) => Effect::Done,
            Err(error) => error.effect(),
        };
        metrics::record_external_call(Call::CreateTrade.into(), effect);
        traded
    }

    async fn create_trade_unrecorded(
        &self,
        request: &TradeRequest<'_>,
        quote: &Quote,
    ) -> Result<Trade, QuoteError> {
        let answer: TradeAnswer = self
            .send(
                Call::CreateTrade,
                self.post(&self.trades, request)
                    .header(IDEMPOTENCY_KEY, request.key),
            )
            .await?;
        let id = answer.trade_id.trim();
        if id.is_empty() || id.chars().count() > ID_MAX {
            return Err(invalid(
                Call::CreateTrade,
                format!("trade_id {:?}", answer.trade_id),
            ));
        }
        if let Some(amount) = answer.amount
            && amount != request.amount
        {
            // A trade under our key for another amount is not the trade asked for: a human
            // has to look (it stays in doubt until then).
            return Err(invalid(
                Call::CreateTrade,
                format!(
                    "trade {id} under key {} is for {amount}, not {}",
                    request.key, request.amount
                ),
            ));
        }
        let fee = answer.fee.unwrap_or(quote.fee);
        let rate = answer.rate.unwrap_or(quote.rate);
        if !rate.is_positive() || fee.is_negative() || fee > request.amount {
            return Err(invalid(
                Call::CreateTrade,
                format!("trade {id}: rate {rate}, fee {fee} for {}", request.amount),
            ));
        }
        Ok(Trade {
            trade_id: id.to_owned(),
            rate,
            fee,
        })
    }

    /// The trade made under `key`, if the quote service has one.
    pub async fn trade_by_key(&self, key: &str) -> Result<Option<TradeRecord>, QuoteError> {
        let mut url = self.trades.clone();
        url.query_pairs_mut().append_pair("idempotency_key", key);
        let page: TradePage = self
            .send(Call::ListTrades, self.authorised(self.http.get(url)))
            .await?;
        Ok(page.trades.into_iter().find(|t| t.idempotency_key == key))
    }

    /// The trades the quote service created in `[since, before)`, a page at a time (see
    /// [`TradePages`]): a reconciliation holds one page, not the window's trades.
    pub fn trades_created(&self, since: DateTime<Utc>, before: DateTime<Utc>) -> TradePages<'_> {
        TradePages {
            client: self,
            since,
            before,
            after: None,
            done: false,
        }
    }

    fn post(&self, url: &Url, body: &impl Serialize) -> reqwest::RequestBuilder {
        self.authorised(self.http.post(url.clone()).json(body))
    }

    fn authorised(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(api_key) => request.bearer_auth(api_key.expose()),
            None => request,
        }
    }

    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        call: Call,
        request: reqwest::RequestBuilder,
    ) -> Result<T, QuoteError> {
        let mut request = request.build().map_err(|e| self.transport(call, e))?;
        let span = propagation::http_client_span(
            &format!("quote.{call}"),
            request.method().as_str(),
            request.url().as_str(),
        );
        TraceHeaders::of_span(&span).on_headers(request.headers_mut());
        let response = self
            .http
            .execute(request)
            .instrument(span.clone())
            .await
            .map_err(|e| self.transport(call, e))?;
        span.record(
            "http.response.status_code",
            i64::from(response.status().as_u16()),
        );
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
    /// Connecting is the one phase in which nothing can have been sent.
    fn transport(&self, call: Call, error: reqwest::Error) -> QuoteError {
        let error = error.without_url();
        let detail = paybus_telemetry::one_line(&error);
        if error.is_connect() {
            QuoteError::Connect { call, detail }
        } else if error.is_timeout() {
            QuoteError::Timeout {
                call,
                timeout: self.timeout,
            }
        } else {
            QuoteError::Transport { call, detail }
        }
    }
}

/// A listing of the trades created in a period, page by page ([`QuoteClient::trades_created`]).
/// It follows the service's `next_after` for as long as it gives one, whatever the size of
/// the page: a service may cap `limit` below what was asked, and stopping at the first short
/// page would leave the rest of the period unjudged.
pub struct TradePages<'c> {
    client: &'c QuoteClient,
    since: DateTime<Utc>,
    before: DateTime<Utc>,
    after: Option<String>,
    done: bool,
}

impl TradePages<'_> {
    /// The next page, or `None` after the last.
    pub async fn next_page(&mut self) -> Result<Option<Vec<TradeRecord>>, QuoteError> {
        if self.done {
            return Ok(None);
        }
        let mut url = self.client.trades.clone();
        {
            let mut query = url.query_pairs_mut();
            query
                .append_pair("created_since", &rfc3339(self.since))
                .append_pair("created_before", &rfc3339(self.before))
                .append_pair("limit", &PAGE.to_string());
            if let Some(after) = &self.after {
                query.append_pair("after", after);
            }
        }
        let page: TradePage = self
            .client
            .send(
                Call::ListTrades,
                self.client.authorised(self.client.http.get(url)),
            )
            .await?;
        // An empty page, or one that points back where it started, ends the listing rather
        // than looping on a service's bug.
        match page.next_after {
            Some(next)
                if !page.trades.is_empty() && self.after.as_deref() != Some(next.as_str()) =>
            {
                self.after = Some(next);
            }
            _ => self.done = true,
        }
        Ok(Some(page.trades))
    }
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
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

    #[test]
    fn only_a_create_trade_can_be_unknown() {
        let timeout = |call| QuoteError::Timeout {
            call,
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout(Call::GetQuote).effect(), Effect::NotDone);
        assert_eq!(timeout(Call::ListTrades).effect(), Effect::NotDone);
        assert_eq!(timeout(Call::CreateTrade).effect(), Effect::Unknown);
        assert_eq!(QuoteError::NotConfigured.effect(), Effect::NotDone);
    }

    #[test]
    fn a_4xx_refuses_except_the_ones_that_speak_of_the_key() {
        let status = |status| QuoteError::Status {
            call: Call::CreateTrade,
            status,
            body: String::new(),
        };
        for refused in [400, 401, 403, 404, 422, 429] {
            assert_eq!(status(refused).effect(), Effect::NotDone, "{refused}");
        }
        for unknown in [408, 409, 425, 500, 502, 503, 504] {
            assert_eq!(status(unknown).effect(), Effect::Unknown, "{unknown}");
        }
    }
}
