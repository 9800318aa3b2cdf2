//! W1's fixtures: sellers and buyers as the API would create them, a quote service stub (a
//! real HTTP server, wiremock) that can be slow, fail or hang and remembers every trade by its
//! idempotency key, and the audit W1 must pass. The seed's lock-holding design they are raced
//! against is `paybus_p2p::seed`.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use paybus_money::Amount;
use paybus_ops::audit::Check;
use paybus_p2p::{
    FillPolicy, MatchingConfig, NewDepositOrder, QuoteConfig,
    quote::{Call, IDEMPOTENCY_KEY, QuoteClient},
};
use paybus_retry::RetryPolicy;
use sqlx::MySqlPool;
use wiremock::{
    Mock, MockServer, Request, Respond, ResponseTemplate,
    matchers::{method, path},
};

use crate::dec;

/// The currency of every fixture.
pub const CURRENCY: &str = "USDT";

/// A partner that takes no webhooks (its notifications are SKIPPED by deliver-webhook).
pub async fn partner(pool: &MySqlPool, name: &str) -> u64 {
    crate::partners::partner(pool, name, None).await
}

/// An OPEN withdraw order of `amount` USDT.
pub async fn seller(pool: &MySqlPool, partner_id: u64, amount: &str) -> u64 {
    seller_in(pool, partner_id, CURRENCY, amount).await
}

/// An OPEN withdraw order of `amount` in `currency`.
pub async fn seller_in(pool: &MySqlPool, partner_id: u64, currency: &str, amount: &str) -> u64 {
    sqlx::query(
        "INSERT INTO p2p_withdraw_orders (partner_id, currency, amount, remaining_amount) \
         VALUES (?, ?, ?, ?)",
    )
    .bind(partner_id)
    .bind(currency)
    .bind(dec(amount))
    .bind(dec(amount))
    .execute(pool)
    .await
    .expect("insert a withdraw order")
    .last_insert_id()
}

/// `n` sellers of `amount` each, oldest first.
pub async fn sellers(pool: &MySqlPool, partner_id: u64, n: usize, amount: &str) -> Vec<u64> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(seller(pool, partner_id, amount).await);
    }
    ids
}

/// A buyer's order of `amount` USDT (no partner reference).
pub fn buyer(partner_id: u64, amount: &str) -> NewDepositOrder {
    buyer_in(partner_id, CURRENCY, amount)
}

/// A buyer's order of `amount` in `currency` (no partner reference).
pub fn buyer_in(partner_id: u64, currency: &str, amount: &str) -> NewDepositOrder {
    NewDepositOrder {
        partner_id,
        partner_order_ref: None,
        idempotency_key: None,
        currency: currency.to_owned(),
        amount: dec(amount),
    }
}

/// Matching against `stub` with `policy`, `max_attempts` and a 1 s backoff (tests move a
/// manual clock past it).
pub fn config(stub: &QuoteStub, policy: FillPolicy, max_attempts: u32) -> MatchingConfig {
    MatchingConfig {
        fill_policy: policy,
        retry: RetryPolicy::with_schedule(max_attempts, vec![Duration::from_secs(1)])
            .expect("a valid policy"),
        quote: stub.config(),
        ..MatchingConfig::default()
    }
}

/// (status, close reason, match_attempt_count) of a deposit order.
pub async fn order_state(pool: &MySqlPool, id: u64) -> (String, Option<String>, u32) {
    sqlx::query_as(
        "SELECT status, close_reason, match_attempt_count FROM p2p_deposit_orders WHERE id = ?",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("read a deposit order")
}

/// The invariants W1's rows must keep: the ledger's and W1's own.
pub const AUDIT: &[&[Check]] = &[paybus_ledger::audit::CHECKS, paybus_p2p::audit::CHECKS];

/// Fails the test on any violation of [`AUDIT`].
pub async fn assert_audit_clean(pool: &MySqlPool) {
    crate::assert_audit_clean(pool, AUDIT).await;
}

// ---------------------------------------------------------------------------------------------
// The quote service stub

/// A trade the stub made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubTrade {
    pub trade_id: String,
    pub amount: Amount,
    pub currency: String,
    pub reference: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// `createTrade` requests that carried its key (a retry of the same fill is one more).
    pub requests: u32,
    seq: u64,
}

/// One call the stub received: which, for which order (`reference`), and when it arrived and
/// was (or will be) answered — the window in which the caller is inside the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubCall {
    pub call: Call,
    pub reference: String,
    pub currency: String,
    pub arrived: Instant,
    pub answered: Instant,
    /// The HTTP status of the answer (200 to a createTrade: a trade made, or found under its
    /// key).
    pub status: u16,
}

impl StubCall {
    /// The deposit order the call is for (`p2p-deposit-{id}`).
    pub fn deposit_order_id(&self) -> Option<u64> {
        self.reference.strip_prefix("p2p-deposit-")?.parse().ok()
    }
}

#[derive(Default)]
struct Book {
    calls: Vec<StubCall>,
    quotes: u64,
    trade_requests: u64,
    listings: u64,
    trades: BTreeMap<String, StubTrade>,
    next_seq: u64,
    failing_quotes: u32,
    failing_trades: u32,
    refused_trades: u32,
    /// The next this many trades are answered after `late_delay`, whatever the delay then.
    late_trades: u32,
    late_delay: Duration,
    /// Listings answer at most this many trades a page, whatever `limit` asked.
    page_cap: Option<usize>,
}

impl Book {
    /// Records a trade under `key` (or returns the one already there).
    fn trade(
        &mut self,
        key: String,
        amount: Amount,
        currency: &str,
        reference: &str,
    ) -> &mut StubTrade {
        self.next_seq += 1;
        let seq = self.next_seq;
        self.trades.entry(key).or_insert_with(|| StubTrade {
            trade_id: format!("t-{seq}"),
            amount,
            currency: currency.to_owned(),
            reference: reference.to_owned(),
            created_at: chrono::Utc::now(),
            requests: 0,
            seq,
        })
    }
}

#[derive(Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    quote_delay_ms: Arc<AtomicU64>,
    trade_delay_ms: Arc<AtomicU64>,
    fee: Amount,
}

impl Shared {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Quotes(Shared);
struct Trades(Shared);
struct TradeListing(Shared);

/// The stub's fixed rate.
const RATE: &str = "1391.5";

/// Records the call: its arrival, when it will be answered and with what; returns the answer.
fn log_call(
    book: &mut Book,
    call: Call,
    request: &Request,
    status: u16,
    delay: Duration,
    answer: ResponseTemplate,
) -> ResponseTemplate {
    let body = request.body_json::<serde_json::Value>().unwrap_or_default();
    let text = |field: &str| body[field].as_str().unwrap_or_default().to_owned();
    let arrived = Instant::now();
    book.calls.push(StubCall {
        call,
        reference: text("reference"),
        currency: text("currency"),
        arrived,
        answered: arrived + delay,
        status,
    });
    answer.set_delay(delay)
}

/// A string field of a request body ("" when absent).
fn field(request: &Request, name: &str) -> String {
    request
        .body_json::<serde_json::Value>()
        .ok()
        .and_then(|body| body[name].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The `amount` of a request body (zero when it has none).
fn amount_of(request: &Request) -> Amount {
    field(request, "amount").parse().unwrap_or(Amount::ZERO)
}

impl Respond for Quotes {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let delay = Duration::from_millis(self.0.quote_delay_ms.load(Ordering::SeqCst));
        let mut book = self.0.book();
        book.quotes += 1;
        if book.failing_quotes > 0 {
            book.failing_quotes -= 1;
            let answer = ResponseTemplate::new(503).set_body_string("quote engine unavailable");
            return log_call(&mut book, Call::GetQuote, request, 503, delay, answer);
        }
        let amount = amount_of(request);
        let n = book.quotes;
        let answer = ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "quote_id": format!("q-{n}"),
            "rate": RATE,
            "fee": self.0.fee.min(amount),
        }));
        log_call(&mut book, Call::GetQuote, request, 200, delay, answer)
    }
}

impl Respond for Trades {
    /// Trades as soon as the request arrives; the delay comes before the answer, so a delay
    /// longer than the client's timeout is a service that traded and then answered late.
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut delay = Duration::from_millis(self.0.trade_delay_ms.load(Ordering::SeqCst));
        let mut book = self.0.book();
        book.trade_requests += 1;
        if book.failing_trades > 0 {
            book.failing_trades -= 1;
            let answer = ResponseTemplate::new(500).set_body_string("trade engine error");
            return log_call(&mut book, Call::CreateTrade, request, 500, delay, answer);
        }
        if book.refused_trades > 0 {
            book.refused_trades -= 1;
            let answer = ResponseTemplate::new(422).set_body_string("quote expired");
            return log_call(&mut book, Call::CreateTrade, request, 422, delay, answer);
        }
        let Some(key) = request
            .headers
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            let answer = ResponseTemplate::new(400).set_body_string("Idempotency-Key is required");
            return log_call(&mut book, Call::CreateTrade, request, 400, delay, answer);
        };
        let amount = amount_of(request);
        let fee = self.0.fee.min(amount);
        let trade = book.trade(
            key,
            amount,
            &field(request, "currency"),
            &field(request, "reference"),
        );
        trade.requests += 1;
        // An idempotent API: the same key is the same trade; reused for another amount, refused.
        if trade.amount != amount {
            let answer = ResponseTemplate::new(409)
                .set_body_string("idempotency key reused with another amount");
            return log_call(&mut book, Call::CreateTrade, request, 409, delay, answer);
        }
        let answer = ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "trade_id": trade.trade_id,
            "amount": trade.amount,
            "rate": RATE,
            "fee": fee,
        }));
        if book.late_trades > 0 {
            book.late_trades -= 1;
            delay = book.late_delay;
        }
        log_call(&mut book, Call::CreateTrade, request, 200, delay, answer)
    }
}

impl Respond for TradeListing {
    /// `GET /v1/trades?idempotency_key=…` or `?created_since=…&created_before=…[&after=…][&limit=…]`.
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let query: BTreeMap<String, String> = request.url.query_pairs().into_owned().collect();
        let time = |name: &str| {
            query
                .get(name)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&chrono::Utc))
        };
        let mut book = self.0.book();
        book.listings += 1;
        let mut trades: Vec<(&String, &StubTrade)> = match query.get("idempotency_key") {
            Some(key) => book.trades.get_key_value(key).into_iter().collect(),
            None => {
                let (Some(since), Some(before)) = (time("created_since"), time("created_before"))
                else {
                    return ResponseTemplate::new(400)
                        .set_body_string("created_since and created_before are required");
                };
                let after = query
                    .get("after")
                    .and_then(|id| book.trades.values().find(|t| &t.trade_id == id))
                    .map_or(0, |t| t.seq);
                book.trades
                    .iter()
                    .filter(|(_, t)| {
                        t.created_at >= since && t.created_at < before && t.seq > after
                    })
                    .collect()
            }
        };
        trades.sort_by_key(|(_, t)| t.seq);
        let limit = query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .unwrap_or(500_usize)
            .min(book.page_cap.unwrap_or(usize::MAX));
        let more = trades.len() > limit;
        trades.truncate(limit);
        let next_after = trades
            .last()
            .filter(|_| more)
            .map(|(_, t)| t.trade_id.clone());
        let trades: Vec<serde_json::Value> = trades
            .into_iter()
            .map(|(key, t)| {
                serde_json::json!({
                    "trade_id": t.trade_id,
                    "idempotency_key": key,
                    "reference": t.reference,
                    "currency": t.currency,
                    "amount": t.amount,
                    "rate": RATE,
                    "fee": self.0.fee.min(t.amount),
                    "created_at": t.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                })
            })
            .collect();
        ResponseTemplate::new(200)
            .set_body_json(serde_json::json!({ "trades": trades, "next_after": next_after }))
    }
}

/// The quote service as a real HTTP server (the seeds' TORQ) with the contract in
/// [`paybus_p2p::quote`]: `POST /v1/quotes`, `POST /v1/trades` (idempotent by key) and
/// `GET /v1/trades`, with adjustable delays and failures.
pub struct QuoteStub {
    server: MockServer,
    shared: Shared,
}

impl QuoteStub {
    /// Answers at once, fee 0.1 per trade.
    pub async fn start() -> Self {
        Self::with_delay(Duration::ZERO).await
    }

    /// Every call takes `delay` before it is answered.
    pub async fn with_delay(delay: Duration) -> Self {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let shared = Shared {
            book: Arc::default(),
            quote_delay_ms: Arc::new(AtomicU64::new(millis)),
            trade_delay_ms: Arc::new(AtomicU64::new(millis)),
            fee: dec("0.1"),
        };
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/quotes"))
            .respond_with(Quotes(shared.clone()))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/trades"))
            .respond_with(Trades(shared.clone()))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/trades"))
            .respond_with(TradeListing(shared.clone()))
            .mount(&server)
            .await;
        Self { server, shared }
    }

    pub fn url(&self) -> String {
        self.server.uri()
    }

    /// A client configuration for this stub (3 s timeout).
    pub fn config(&self) -> QuoteConfig {
        QuoteConfig {
            url: Some(self.server.uri().parse().expect("the stub's URL")),
            ..QuoteConfig::default()
        }
    }

    /// A client of this stub.
    pub fn client(&self) -> QuoteClient {
        QuoteClient::new(&self.config())
            .expect("a quote client")
            .expect("the stub's URL is configured")
    }

    /// From now on, `createTrade` answers after `delay`, having traded at once: longer than
    /// the client's timeout, it is the service that trades and then answers late.
    pub fn set_trade_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.trade_delay_ms.store(millis, Ordering::SeqCst);
    }

    /// The next `n` `getQuote` calls answer 503.
    pub fn fail_next_quotes(&self, n: u32) {
        self.shared.book().failing_quotes = n;
    }

    /// The next `n` `createTrade` calls answer 500 without trading (the client cannot know:
    /// an unknown outcome, resolved by asking again).
    pub fn fail_next_trades(&self, n: u32) {
        self.shared.book().failing_trades = n;
    }

    /// The next `n` `createTrade` calls are refused with 422 without trading (a definitive
    /// refusal: not done).
    pub fn refuse_next_trades(&self, n: u32) {
        self.shared.book().refused_trades = n;
    }

    /// The next `n` trades (createTrade calls that make or find their trade) are answered
    /// after `delay`, whatever the delay is then: longer than the client's timeout, `n`
    /// trades the service made and answered late, whatever the timing of the load.
    pub fn answer_next_trades_after(&self, n: u32, delay: Duration) {
        let mut book = self.shared.book();
        book.late_trades = n;
        book.late_delay = delay;
    }

    /// A trade the service made that paybus never asked for (reconciliation's orphan).
    pub fn plant_trade(&self, key: &str, amount: &str, reference: &str) -> String {
        self.shared
            .book()
            .trade(key.to_owned(), dec(amount), CURRENCY, reference)
            .trade_id
            .clone()
    }

    /// From now on, a listing's page holds at most `trades`, however many were asked for (as
    /// services cap `limit`); `next_after` says there are more.
    pub fn cap_listing_pages(&self, trades: usize) {
        self.shared.book().page_cap = Some(trades);
    }

    /// The trade under `key` was made `by` earlier than it was (reconciliation only judges
    /// trades older than the clock skew it allows).
    pub fn backdate_trade(&self, key: &str, by: Duration) {
        if let Some(trade) = self.shared.book().trades.get_mut(key) {
            trade.created_at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// The service loses the trade made under `key` (reconciliation's missing trade).
    pub fn forget_trade(&self, key: &str) -> Option<StubTrade> {
        self.shared.book().trades.remove(key)
    }

    /// `getQuote` calls received so far.
    pub fn quote_calls(&self) -> u64 {
        self.shared.book().quotes
    }

    /// `createTrade` calls received so far.
    pub fn trade_calls(&self) -> u64 {
        self.shared.book().trade_requests
    }

    /// `createTrade` calls answered 200 (a trade made, or found under its key) later than
    /// `timeout` after they arrived: trades whose caller gave up waiting first.
    pub fn trades_answered_after(&self, timeout: Duration) -> u64 {
        self.shared
            .book()
            .calls
            .iter()
            .filter(|c| {
                c.call == Call::CreateTrade && c.status == 200 && c.answered - c.arrived > timeout
            })
            .count() as u64
    }

    /// `GET /v1/trades` calls received so far (listings and lookups by key).
    pub fn listing_calls(&self) -> u64 {
        self.shared.book().listings
    }

    /// Every call received, in arrival order.
    pub fn calls(&self) -> Vec<StubCall> {
        self.shared.book().calls.clone()
    }

    /// Every trade made, by idempotency key.
    pub fn trades(&self) -> BTreeMap<String, StubTrade> {
        self.shared.book().trades.clone()
    }
}
