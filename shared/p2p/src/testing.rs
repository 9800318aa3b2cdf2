//! Fixtures for tests and the benchmark (feature `test-harness`): sellers and buyers as the
//! API would create them, a quote service stub (a real HTTP server, wiremock) that can be slow,
//! fail or hang and remembers every trade by its idempotency key, the seed's lock-holding
//! design (the control of the race tests and the benchmark's baseline), and the audit W1 must
//! pass.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use paybus_money::{Amount, dec};
use paybus_platform::{
    audit::Check,
    bus::Outbox,
    retry::{Clock, RetryPolicy},
    testing::assert_audit_clean as assert_clean,
};
use sqlx::MySqlPool;
use uuid::Uuid;
use wiremock::{
    Mock, MockServer, Request, Respond, ResponseTemplate,
    matchers::{method, path},
};

use crate::{
    CreateError, FillPolicy, MatchError, MatchingConfig, QuoteConfig,
    config::{CANDIDATES, DEFAULT_ORDER_TTL},
    deposit_order::{self, CloseReason, Closer, Inserted, NewDepositOrder},
    matches::{self, Reserved},
    quote::{Call, IDEMPOTENCY_KEY, QuoteClient, TradeRequest},
    reserve::Fill,
    settle,
};

/// The currency of every fixture.
pub const CURRENCY: &str = "USDT";

/// A partner that takes no webhooks (its notifications are SKIPPED by deliver-webhook).
pub async fn partner(pool: &MySqlPool, name: &str) -> u64 {
    paybus_partners::testing::partner(pool, name, None).await
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
pub const AUDIT: &[&[Check]] = &[paybus_ledger::audit::CHECKS, crate::audit::CHECKS];

/// Fails the test on any violation of [`AUDIT`].
pub async fn assert_audit_clean(pool: &MySqlPool) {
    assert_clean(pool, AUDIT).await;
}

// ---------------------------------------------------------------------------------------------
// The quote service stub

/// A trade the stub made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubTrade {
    pub trade_id: String,
    pub amount: Amount,
    /// `createTrade` requests that carried its key (a retry of the same fill is one more).
    pub requests: u32,
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
    trades: BTreeMap<String, StubTrade>,
    failing_quotes: u32,
    refused_trades: u32,
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

/// Records the call's arrival and when it will be answered.
fn log_call(book: &mut Book, call: Call, request: &Request, delay: Duration) {
    let body = request.body_json::<serde_json::Value>().unwrap_or_default();
    let text = |field: &str| body[field].as_str().unwrap_or_default().to_owned();
    let arrived = Instant::now();
    book.calls.push(StubCall {
        call,
        reference: text("reference"),
        currency: text("currency"),
        arrived,
        answered: arrived + delay,
    });
}

/// The `amount` of a request body (zero when it has none).
fn amount_of(request: &Request) -> Amount {
    request
        .body_json::<serde_json::Value>()
        .ok()
        .and_then(|body| {
            body["amount"]
                .as_str()
                .and_then(|a| a.parse::<Amount>().ok())
        })
        .unwrap_or(Amount::ZERO)
}

impl Respond for Quotes {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let delay = Duration::from_millis(self.0.quote_delay_ms.load(Ordering::SeqCst));
        let mut book = self.0.book();
        log_call(&mut book, Call::GetQuote, request, delay);
        book.quotes += 1;
        if book.failing_quotes > 0 {
            book.failing_quotes -= 1;
            return ResponseTemplate::new(503)
                .set_body_string("quote engine unavailable")
                .set_delay(delay);
        }
        let amount = amount_of(request);
        let n = book.quotes;
        ResponseTemplate::new(200)
            .set_body_json(serde_json::json!({
                "quote_id": format!("q-{n}"),
                "rate": "1391.5",
                "fee": self.0.fee.min(amount),
            }))
            .set_delay(delay)
    }
}

impl Respond for Trades {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let delay = Duration::from_millis(self.0.trade_delay_ms.load(Ordering::SeqCst));
        let mut book = self.0.book();
        log_call(&mut book, Call::CreateTrade, request, delay);
        book.trade_requests += 1;
        if book.refused_trades > 0 {
            book.refused_trades -= 1;
            return ResponseTemplate::new(500)
                .set_body_string("trade engine error")
                .set_delay(delay);
        }
        let Some(key) = request
            .headers
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            return ResponseTemplate::new(400).set_body_string("Idempotency-Key is required");
        };
        let amount = amount_of(request);
        let next = book.trades.len() + 1;
        let trade = book.trades.entry(key).or_insert_with(|| StubTrade {
            trade_id: format!("t-{next}"),
            amount,
            requests: 0,
        });
        trade.requests += 1;
        // An idempotent API: the same key is the same trade; reused for another amount, refused.
        if trade.amount != amount {
            return ResponseTemplate::new(422)
                .set_body_string("idempotency key reused with another amount")
                .set_delay(delay);
        }
        ResponseTemplate::new(200)
            .set_body_json(serde_json::json!({ "trade_id": trade.trade_id }))
            .set_delay(delay)
    }
}

/// The quote service as a real HTTP server (the seeds' TORQ): `POST /v1/quotes` and
/// `POST /v1/trades`, idempotent by key, with adjustable delays and failures.
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

    /// From now on, `createTrade` takes `delay` (e.g. longer than the client's timeout: a
    /// hanging service).
    pub fn set_trade_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.trade_delay_ms.store(millis, Ordering::SeqCst);
    }

    /// The next `n` `getQuote` calls answer 503.
    pub fn fail_next_quotes(&self, n: u32) {
        self.shared.book().failing_quotes = n;
    }

    /// The next `n` `createTrade` calls answer 500 without trading.
    pub fn refuse_next_trades(&self, n: u32) {
        self.shared.book().refused_trades = n;
    }

    /// `getQuote` calls received so far.
    pub fn quote_calls(&self) -> u64 {
        self.shared.book().quotes
    }

    /// `createTrade` calls received so far.
    pub fn trade_calls(&self) -> u64 {
        self.shared.book().trade_requests
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

// ---------------------------------------------------------------------------------------------
// The seed's design

/// The seed's `createAndMatch` (seed 000 §0), for the race tests' control and the benchmark's
/// baseline: ONE transaction from the order's insert to its commit, `FOR UPDATE` (waiting, not
/// skipping) on the oldest candidates and on the partner's lock row, and the quote service
/// called with all of them held. Fill-or-cancel, the same rows and legs as the real path.
///
/// Under concurrency its REPEATABLE READ locking reads also deadlock on each other's gap
/// locks; a transaction that lost one is tried again, so what is measured is its lock holding.
pub async fn create_and_match_holding_locks(
    outbox: &Outbox,
    quote: &QuoteClient,
    new: &NewDepositOrder,
) -> Result<(u64, CloseReason), MatchError> {
    loop {
        match seed_create_and_match(outbox, quote, new).await {
            Err(MatchError::Database(error))
                if paybus_platform::db::error_number(&error) == Some(1213) => {}
            other => return other,
        }
    }
}

async fn seed_create_and_match(
    outbox: &Outbox,
    quote: &QuoteClient,
    new: &NewDepositOrder,
) -> Result<(u64, CloseReason), MatchError> {
    let clock = Clock::Database;
    let mut tx = outbox.begin().await?;
    // ① the order.
    let id = match deposit_order::insert(&mut tx, new, DEFAULT_ORDER_TTL, &clock).await {
        Ok(Inserted::New(id)) => id,
        Ok(Inserted::Existing(id)) => {
            return Err(MatchError::inconsistent(format!(
                "deposit order {id} already exists for this reference"
            )));
        }
        Err(CreateError::Match(error)) => return Err(error),
        Err(other) => return Err(MatchError::inconsistent(other.to_string())),
    };
    // ② the candidates, locked and waited for.
    let candidates: Vec<(u64, u64, Amount)> = sqlx::query_as(
        "SELECT id, partner_id, remaining_amount - reserved_amount FROM p2p_withdraw_orders \
         WHERE status = 'OPEN' AND currency = ? AND remaining_amount > reserved_amount \
         ORDER BY created_at, id LIMIT ? FOR UPDATE",
    )
    .bind(&new.currency)
    .bind(CANDIDATES)
    .fetch_all(&mut *tx)
    .await?;
    // ③ the partner's lock row.
    sqlx::query("SELECT id FROM partners WHERE id = ? FOR UPDATE")
        .bind(new.partner_id)
        .execute(&mut *tx)
        .await?;
    let mut left = new.amount;
    let mut reserved = Vec::new();
    let trade_key = format!("p2p-deposit-{id}-fill-1");
    for (withdraw_order_id, seller_partner_id, available) in candidates {
        if left.is_zero() {
            break;
        }
        let amount = available.min(left);
        left = left.checked_sub(amount).unwrap_or(Amount::ZERO);
        let match_id = matches::reserve(&mut tx, id, withdraw_order_id, amount, &trade_key).await?;
        reserved.push(Reserved {
            match_id,
            withdraw_order_id,
            seller_partner_id,
            amount,
        });
    }
    let reason = if left.is_zero() {
        // ④ the external call, every lock above still held.
        let (quote, trade) = quote
            .trade(&TradeRequest {
                currency: &new.currency,
                amount: new.amount,
                reference: format!("p2p-deposit-{id}"),
                key: &trade_key,
            })
            .await?;
        // ⑤ the matches.
        let fill = Fill {
            deposit_order_id: id,
            buyer_partner_id: new.partner_id,
            currency: new.currency.clone(),
            matches: reserved,
            total: new.amount,
            trade_key,
        };
        settle::confirm_fill(&mut tx, &fill, new.amount, &quote, &trade).await?;
        CloseReason::Filled
    } else {
        CloseReason::NoLiquidity
    };
    deposit_order::close(
        &mut tx,
        id,
        Closer::Locked,
        reason,
        None,
        &clock,
        Uuid::now_v7(),
    )
    .await?;
    // ⑥ commit: only now are the locks released.
    tx.commit().await?;
    Ok((id, reason))
}
