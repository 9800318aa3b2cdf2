//! The mixed load, through the public entry points only (the HTTP API), all four workflows at
//! once. Every idempotent call is sent `copies` times at once (a client retrying while its
//! first call is in flight); every call is retried on a transport error or a 5xx until it gets
//! a definitive answer (the database or broker may be restarting), within a bound.
//!
//! Chaos spreads a fixed number of items over its fault window ([`Plan::Spread`]), so every
//! fault lands on a live load (a killed API had requests in flight, a partition cut
//! transactions short); the soak sends each workflow's items at a rate of its own for a while
//! ([`Plan::Paced`]).

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use reqwest::Method;
use serde::Serialize;
use serde_json::{Value, json};

use super::{
    Profile,
    outside::{Api, CHAIN_MONITOR_SECRET, PAYMENTS_SECRET, World},
};
use crate::drive::drive;

/// How many items the drivers send, and when.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Plan {
    /// This many items in all, split over the workflows ([`Shares`]), each workflow's spread
    /// evenly over this long (a driver behind goes as fast as its concurrency allows).
    Spread(usize, Duration),
    /// Each workflow at its own rate for this long (the soak).
    Paced(Rates, Duration),
}

/// Items per second of each workflow: p2p deposit orders, confirmations (withdrawals and
/// deposits), payment completions, market orders placed.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Rates {
    pub(crate) p2p: f64,
    pub(crate) confirmations: f64,
    pub(crate) bonuses: f64,
    pub(crate) markets: f64,
}

/// One driver's part of a [`Plan`].
#[derive(Debug, Clone, Copy)]
struct Schedule {
    /// The items it sends (at most: the deadline may come first).
    items: usize,
    pace: Pace,
}

#[derive(Debug, Clone, Copy)]
struct Pace {
    per_second: f64,
    /// The load's start: item `i` is due `i / per_second` after it, setup included, so a
    /// driver whose setup took a while catches up instead of running past the soak's end.
    from: tokio::time::Instant,
    lasting: Duration,
}

/// Setup sized by the items (sellers, members) is sized by at most this many: a soak's
/// hundreds of thousands of items would otherwise spend minutes creating members.
const SETUP_ITEMS: usize = 2_000;

/// How the market load cuts its orders into markets. A market takes the orders of `lifetime`
/// (at least `orders`) before the next takes over; ops suspend it halfway (placing goes on,
/// and is refused, until then), so suspensions and their cancels spread over the run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct MarketCadence {
    pub lifetime: Duration,
    pub orders: usize,
}

impl MarketCadence {
    /// Chaos's and the soak's: markets of a hundred orders or more, the cancel a batch.
    pub const HUNDREDS: Self = Self {
        lifetime: Duration::from_secs(10),
        orders: 100,
    };
}

impl Schedule {
    fn paced(per_second: f64, from: tokio::time::Instant, lasting: Duration) -> Self {
        Self {
            items: (per_second * lasting.as_secs_f64()).ceil() as usize,
            pace: Pace {
                per_second,
                from,
                lasting,
            },
        }
    }

    fn spread(items: usize, from: tokio::time::Instant, lasting: Duration) -> Self {
        Self {
            items,
            pace: Pace {
                per_second: items as f64 / lasting.as_secs_f64().max(0.001),
                from,
                lasting,
            },
        }
    }

    /// The items setup is sized by.
    fn setup_items(&self) -> usize {
        self.items.min(SETUP_ITEMS)
    }

    /// Runs `work(i)` for every item on `concurrency` tasks, item `i` not before
    /// `i / rate` seconds from the load's start and none from the deadline on (a driver behind
    /// its pace sends as fast as its concurrency allows, never more at once). The items sent.
    async fn send<F, Fut>(&self, concurrency: u16, work: F) -> anyhow::Result<usize>
    where
        F: Fn(usize) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send,
    {
        let pace = self.pace;
        let start = pace.from;
        let until = start + pace.lasting;
        let sent = Arc::new(AtomicUsize::new(0));
        drive(self.items, concurrency, {
            let sent = sent.clone();
            move |i| {
                let (work, sent) = (work.clone(), sent.clone());
                async move {
                    let due = start + Duration::from_secs_f64(i as f64 / pace.per_second);
                    if due >= until {
                        return Ok(());
                    }
                    tokio::time::sleep_until(due).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                    work(i).await
                }
            }
        })
        .await?;
        Ok(sent.load(Ordering::Relaxed))
    }
}

/// A request that gets no definitive answer (2xx/4xx) within this is lost: a violation.
const REQUEST_DEADLINE: Duration = Duration::from_secs(120);
/// How long one attempt of a call that is safe to repeat waits for its answer.
const CALL_PATIENCE: Duration = Duration::from_secs(15);

/// What one workflow's driver sent and what it was answered.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Sent {
    /// Workflow items (orders, withdrawals + deposits, charges, market orders).
    pub items: usize,
    pub requests: usize,
    /// Answers by HTTP status.
    pub answers: BTreeMap<u16, usize>,
    /// Requests that never got a definitive answer (each one a violation).
    pub lost: Vec<String>,
    /// Fixtures whose create had an unknown outcome and that were found made.
    pub recovered: usize,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Load {
    pub p2p_deposit_orders: Sent,
    pub confirmations: Sent,
    pub payment_completions: Sent,
    pub market_orders: Sent,
    /// W4: markets suspended while their orders were being placed and filled.
    pub markets: usize,
}

#[derive(Default)]
struct Tally(Mutex<Sent>);

impl Tally {
    fn answered(&self, status: u16) {
        let mut sent = self.0.lock().unwrap_or_else(|p| p.into_inner());
        sent.requests += 1;
        *sent.answers.entry(status).or_default() += 1;
    }

    fn recovered(&self) {
        let mut sent = self.0.lock().unwrap_or_else(|p| p.into_inner());
        sent.recovered += 1;
    }

    fn lost(&self, what: String) {
        let mut sent = self.0.lock().unwrap_or_else(|p| p.into_inner());
        sent.requests += 1;
        sent.lost.push(what);
    }

    fn take(&self, items: usize) -> Sent {
        let mut sent = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        sent.items = items;
        sent
    }
}

/// Who signs a request (the intake's and the payment service's HMAC), or whose key it carries.
#[derive(Clone, Copy)]
enum Signer<'a> {
    Admin,
    ChainMonitor,
    PaymentService,
    /// A partner's API key, with the request's Idempotency-Key if it has one.
    Partner {
        key: &'a str,
        idempotency_key: Option<&'a str>,
    },
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    admin_token: String,
    /// The run's database: where a fixture whose create had an unknown outcome is looked for.
    db: sqlx::MySqlPool,
}

impl Client {
    /// One attempt: a definitive answer (2xx/4xx, but not 408, 429 or a 409 that asks to
    /// retry), or why the outcome is unknown (a transport error or timeout after sending, a
    /// 5xx: the request may or may not have taken effect).
    async fn attempt(
        &self,
        signer: Signer<'_>,
        method: &Method,
        path: &str,
        bytes: &[u8],
        patience: Duration,
    ) -> Result<(u16, Value), String> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(patience)
            .header("content-type", "application/json")
            .body(bytes.to_vec());
        request = match signer {
            Signer::Admin => request.bearer_auth(&self.admin_token),
            Signer::ChainMonitor => request.header(
                paybus_config::signature::HEADER,
                sign(CHAIN_MONITOR_SECRET, bytes),
            ),
            Signer::PaymentService => request.header(
                paybus_config::signature::HEADER,
                sign(PAYMENTS_SECRET, bytes),
            ),
            Signer::Partner {
                key,
                idempotency_key,
            } => {
                let request = request.bearer_auth(key);
                match idempotency_key {
                    Some(idempotency_key) => request.header("idempotency-key", idempotency_key),
                    None => request,
                }
            }
        };
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        // A 409 with Retry-After is "the same request is still running" (a copy under one
        // Idempotency-Key): a real client waits and asks again.
        let busy = status == 409 && response.headers().contains_key("retry-after");
        if status >= 500 || status == 408 || status == 429 || busy {
            return Err(format!("HTTP {status}"));
        }
        Ok((
            status,
            response.json::<Value>().await.unwrap_or(Value::Null),
        ))
    }

    /// One call, retried until a definitive answer: (status, body). Only for calls a retry
    /// cannot make twice (signed confirmations and completions, partner calls under their
    /// keys, admin actions guarded by state); a create of a row is [`Client::create_fixture`].
    /// Tallied; a call that never gets one is tallied as lost and is an error.
    async fn call(
        &self,
        tally: &Tally,
        signer: Signer<'_>,
        method: Method,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<(u16, Value)> {
        let bytes = serde_json::to_vec(body)?;
        let mut retry = Retry::new();
        loop {
            match self
                .attempt(signer, &method, path, &bytes, CALL_PATIENCE)
                .await
            {
                Ok((status, answer)) => {
                    tally.answered(status);
                    return Ok((status, answer));
                }
                Err(last) => retry.after(tally, &method, path, &last).await?,
            }
        }
    }

    /// Creates `fixture` — a row another system owns in production (a withdrawal being
    /// broadcast, a deposit seen on chain, a purchase awaiting payment), made here through the
    /// admin API — exactly once. A plain retry made a second withdrawal the load never
    /// confirmed, left BROADCASTING for ever (the soak's first runs). So the client waits for
    /// the answer however long the server takes (the API runs every request to its end), and
    /// after an attempt whose outcome is still unknown — a 5xx, or a connection reset by an API
    /// that died — it looks the row up by the natural key the item gave it, and sends the
    /// request again only when the row is provably not there. Its id.
    async fn create_fixture(
        &self,
        tally: &Tally,
        path: &str,
        body: &Value,
        fixture: Fixture,
    ) -> anyhow::Result<u64> {
        let bytes = serde_json::to_vec(body)?;
        let mut retry = Retry::new();
        let mut unknown_before = false;
        loop {
            let last = match self
                .attempt(Signer::Admin, &Method::POST, path, &bytes, REQUEST_DEADLINE)
                .await
            {
                Ok((status, answer)) => {
                    tally.answered(status);
                    if (200..300).contains(&status) {
                        return id_of(&answer);
                    }
                    // Refused after an attempt whose outcome was unknown: that attempt may
                    // have made the row after all (a COMMIT the server finished after the API
                    // died) — the refusal is then the row's unique key speaking.
                    if unknown_before && let Ok(Some(id)) = fixture.find(&self.db).await {
                        tally.recovered();
                        return Ok(id);
                    }
                    bail!("POST {path} {body}: {status} {answer}");
                }
                Err(last) => last,
            };
            unknown_before = true;
            // Pause first: a COMMIT that reached the server before the API died lands
            // meanwhile, and the lookup then sees it.
            retry.after(tally, &Method::POST, path, &last).await?;
            loop {
                // The database may be restarting too: ask until it answers.
                match fixture.find(&self.db).await {
                    Ok(Some(id)) => {
                        tally.recovered();
                        return Ok(id);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        retry
                            .after(tally, &Method::POST, path, &format!("{last}; lookup: {e}"))
                            .await?
                    }
                }
            }
        }
    }

    /// The same call `copies` times at once; the first copy's answer.
    async fn copies(
        &self,
        tally: &Tally,
        copies: u32,
        signer: Signer<'_>,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<(u16, Value)> {
        let calls = (0..copies).map(|_| self.call(tally, signer, Method::POST, path, body));
        let mut answers = futures_util::future::join_all(calls).await.into_iter();
        answers.next().context("at least one copy")?
    }

    async fn admin_post(&self, tally: &Tally, path: &str, body: Value) -> anyhow::Result<Value> {
        self.post_as(tally, Signer::Admin, path, body).await
    }

    /// A POST that must answer 2xx.
    async fn post_as(
        &self,
        tally: &Tally,
        signer: Signer<'_>,
        path: &str,
        body: Value,
    ) -> anyhow::Result<Value> {
        let (status, answer) = self.call(tally, signer, Method::POST, path, &body).await?;
        if !(200..300).contains(&status) {
            bail!("POST {path} {body}: {status} {answer}");
        }
        Ok(answer)
    }

    /// The partner `name` (once in a run), taking webhooks at `webhook_url` if any.
    async fn partner(
        &self,
        tally: &Tally,
        name: &str,
        webhook_url: Option<&str>,
    ) -> anyhow::Result<u64> {
        let secret = format!("{}-webhook-secret", name.replace(' ', "-"));
        let body = match webhook_url {
            Some(url) => json!({"name": name, "webhook_url": url, "webhook_secret": secret}),
            None => json!({"name": name, "webhook_secret": secret}),
        };
        let fixture = Fixture::Partner {
            name: name.to_owned(),
        };
        self.create_fixture(tally, "/v1/admin/partners", &body, fixture)
            .await
    }

    /// A new API key of `partner`, as an ADMIN creates one.
    async fn partner_key(&self, tally: &Tally, partner: u64) -> anyhow::Result<String> {
        let answer = self
            .admin_post(
                tally,
                &format!("/v1/admin/partners/{partner}/api-keys"),
                json!({"label": "chaos"}),
            )
            .await?;
        answer["key"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("a key in {answer}"))
    }
}

async fn by_name(
    sql: &'static str,
    name: &str,
    db: &sqlx::MySqlPool,
) -> Result<Option<u64>, sqlx::Error> {
    sqlx::query_scalar(sql).bind(name).fetch_optional(db).await
}

/// The pause between attempts of one call, and its deadline.
struct Retry {
    started: Instant,
    pause: Duration,
}

impl Retry {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            pause: Duration::from_millis(100),
        }
    }

    /// Waits before the next attempt, or gives up (tallied as lost) past the deadline.
    async fn after(
        &mut self,
        tally: &Tally,
        method: &Method,
        path: &str,
        last: &str,
    ) -> anyhow::Result<()> {
        if self.started.elapsed() > REQUEST_DEADLINE {
            let what = format!(
                "{method} {path}: no definitive answer in {REQUEST_DEADLINE:?} (last: {last})"
            );
            tally.lost(what.clone());
            bail!(what);
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
        Ok(())
    }
}

/// A fixture's natural key: what finds the row an attempt with an unknown outcome may have
/// made.
enum Fixture {
    /// A withdrawal to an address no other item uses.
    Withdrawal {
        to_address: String,
    },
    /// A deposit of a transaction no other item uses.
    Deposit {
        tx_hash: String,
    },
    /// A purchase whose method names its item (the purchase's method is only a label: the
    /// bonus jobs snapshot their own reason).
    Purchase {
        member_id: u64,
        method: String,
    },
    /// The run's set-up, each named once in a run.
    Partner {
        name: String,
    },
    Member {
        nickname: String,
    },
    ChargeEvent {
        title: String,
    },
    Market {
        symbol: String,
    },
}

impl Fixture {
    async fn find(&self, db: &sqlx::MySqlPool) -> Result<Option<u64>, sqlx::Error> {
        match self {
            Self::Withdrawal { to_address } => {
                sqlx::query_scalar("SELECT id FROM withdrawals WHERE to_address = ? LIMIT 1")
                    .bind(to_address)
                    .fetch_optional(db)
                    .await
            }
            Self::Deposit { tx_hash } => {
                sqlx::query_scalar("SELECT id FROM deposits WHERE tx_hash = ? LIMIT 1")
                    .bind(tx_hash)
                    .fetch_optional(db)
                    .await
            }
            Self::Partner { name } => {
                by_name("SELECT id FROM partners WHERE name = ?", name, db).await
            }
            Self::Member { nickname } => {
                by_name("SELECT id FROM members WHERE nickname = ?", nickname, db).await
            }
            Self::ChargeEvent { title } => {
                by_name("SELECT id FROM charge_events WHERE title = ?", title, db).await
            }
            Self::Market { symbol } => {
                by_name("SELECT id FROM markets WHERE symbol = ?", symbol, db).await
            }
            Self::Purchase { member_id, method } => {
                sqlx::query_scalar(
                    "SELECT id FROM charges \
                     WHERE member_id = ? AND status = 'CHARGE' AND method = ? LIMIT 1",
                )
                .bind(member_id)
                .bind(method)
                .fetch_optional(db)
                .await
            }
        }
    }
}

fn sign(secret: &str, body: &[u8]) -> String {
    paybus_config::signature::sign(secret.as_bytes(), chrono::Utc::now().timestamp(), body)
}

fn id_of(answer: &Value) -> anyhow::Result<u64> {
    answer["id"]
        .as_u64()
        .with_context(|| format!("an id in {answer}"))
}

/// The run's items split over the workflows: p2p 20 %, confirmations 30 %, bonuses 20 %,
/// markets 30 %.
struct Shares {
    p2p: usize,
    confirmations: usize,
    bonuses: usize,
    markets: usize,
}

impl Shares {
    fn of(items: usize) -> Self {
        let p2p = items / 5;
        let confirmations = items * 3 / 10;
        let bonuses = items / 5;
        Self {
            p2p,
            confirmations,
            bonuses,
            markets: items - p2p - confirmations - bonuses,
        }
    }
}

pub(crate) async fn run_plan(
    profile: &Profile,
    api: &Api,
    world: &World,
    db: &sqlx::MySqlPool,
    plan: Plan,
) -> anyhow::Result<Load> {
    let client = Client {
        http: reqwest::Client::builder().build()?,
        base: api.base.clone(),
        admin_token: api.admin_token.clone(),
        db: db.clone(),
    };
    let from = tokio::time::Instant::now();
    let [p2p_plan, confirmations_plan, bonuses_plan, markets_plan] = match plan {
        Plan::Spread(items, lasting) => {
            let shares = Shares::of(items);
            [
                shares.p2p,
                shares.confirmations,
                shares.bonuses,
                shares.markets,
            ]
            .map(|items| Schedule::spread(items, from, lasting))
        }
        Plan::Paced(rates, lasting) => {
            [rates.p2p, rates.confirmations, rates.bonuses, rates.markets]
                .map(|per_second| Schedule::paced(per_second, from, lasting))
        }
    };
    let tallies: [Arc<Tally>; 4] = Default::default();
    let (p2p, confirmed, bonuses, markets) = tokio::join!(
        p2p_deposit_orders(profile, &client, world, p2p_plan, tallies[0].clone()),
        confirmations(
            profile,
            &client,
            world,
            confirmations_plan,
            tallies[1].clone()
        ),
        payment_completions(profile, &client, bonuses_plan, tallies[2].clone()),
        market_orders(profile, &client, markets_plan, tallies[3].clone()),
    );
    // A lost request is reported as a violation, not as a failed run.
    for (name, result) in [
        ("p2p", &p2p),
        ("confirmations", &confirmed),
        ("bonuses", &bonuses),
    ] {
        if let Err(e) = result {
            tracing::warn!(workflow = name, error = %format!("{e:#}"), "chaos load");
        }
    }
    let (market_orders_sent, markets) = match &markets {
        Ok(sent) => *sent,
        Err(e) => {
            tracing::warn!(workflow = "markets", error = %format!("{e:#}"), "chaos load");
            (markets_plan.items, 0)
        }
    };
    // A driver that failed is counted as if it had sent all it was to.
    let sent = |result: &anyhow::Result<usize>, schedule: Schedule| {
        *result.as_ref().unwrap_or(&schedule.items)
    };
    let load = Load {
        p2p_deposit_orders: tallies[0].take(sent(&p2p, p2p_plan)),
        confirmations: tallies[1].take(sent(&confirmed, confirmations_plan)),
        payment_completions: tallies[2].take(sent(&bonuses, bonuses_plan)),
        market_orders: tallies[3].take(market_orders_sent),
        markets,
    };
    // Setup that failed outright (not a lost request) is the harness's own failure.
    for result in [p2p, confirmed, bonuses] {
        if let Err(e) = result
            && load.lost().is_empty()
        {
            return Err(e);
        }
    }
    Ok(load)
}

impl Load {
    /// Every request that never got a definitive answer.
    pub fn lost(&self) -> Vec<String> {
        [
            &self.p2p_deposit_orders,
            &self.confirmations,
            &self.payment_completions,
            &self.market_orders,
        ]
        .iter()
        .flat_map(|sent| sent.lost.clone())
        .collect()
    }
}

/// W1: deposit orders queued for match-deposit (the switch is on), each created `copies`
/// times at once under one partner reference, against plenty of sellers.
async fn p2p_deposit_orders(
    profile: &Profile,
    client: &Client,
    world: &World,
    schedule: Schedule,
    tally: Arc<Tally>,
) -> anyhow::Result<usize> {
    let orders = schedule.items;
    let buyer = client
        .partner(&tally, "chaos p2p buyer", Some(&world.webhook_url))
        .await?;
    let seller = client.partner(&tally, "chaos p2p seller", None).await?;
    // Partners act with their own API keys, as deployed.
    let seller_key = client.partner_key(&tally, seller).await?;
    let buyer_key = Arc::new(client.partner_key(&tally, buyer).await?);
    let sellers = (schedule.setup_items() / 20).max(10);
    // Orders are 1 to 5 USDT: every order can be filled whatever the interleaving.
    let each = (orders * 5 / sellers + 10).to_string();
    for n in 0..sellers {
        let idempotency_key = format!("chaos-sell-{n}");
        client
            .post_as(
                &tally,
                Signer::Partner {
                    key: &seller_key,
                    idempotency_key: Some(&idempotency_key),
                },
                "/v1/partner/p2p/withdraw-orders",
                json!({"currency": "USDT", "amount": each}),
            )
            .await?;
    }
    let (client, copies) = (client.clone(), profile.copies);
    schedule
        .send(profile.concurrency, move |i| {
            let (client, tally, buyer_key) = (client.clone(), tally.clone(), buyer_key.clone());
            async move {
                // Every copy carries the order's reference and its Idempotency-Key, as a partner
                // re-sending a request does.
                let body = json!({"currency": "USDT", "amount": (i % 5 + 1).to_string(),
                              "partner_order_ref": format!("chaos-{i}")});
                let idempotency_key = format!("chaos-buy-{i}");
                let _ = client
                    .copies(
                        &tally,
                        copies,
                        Signer::Partner {
                            key: &buyer_key,
                            idempotency_key: Some(&idempotency_key),
                        },
                        "/v1/partner/p2p/deposit-orders",
                        &body,
                    )
                    .await;
                Ok(())
            }
        })
        .await
}

/// W2: withdrawals in BROADCASTING confirmed through the signed intake, and deposits
/// confirmed the same way (two in three items are withdrawals); each confirmation sent
/// `copies` times at once.
async fn confirmations(
    profile: &Profile,
    client: &Client,
    world: &World,
    schedule: Schedule,
    tally: Arc<Tally>,
) -> anyhow::Result<usize> {
    let partner = client
        .partner(&tally, "chaos exchange", Some(&world.webhook_url))
        .await?;
    let (client, copies) = (client.clone(), profile.copies);
    schedule
        .send(profile.concurrency, move |i| {
            let (client, tally) = (client.clone(), tally.clone());
            async move {
                let amount = format!("{}.{:02}", i % 90 + 10, i % 100);
                if i % 3 == 2 {
                    let tx_hash = format!("0xdeposit{i}");
                    let Ok(deposit) = client
                        .create_fixture(
                            &tally,
                            "/v1/admin/deposits",
                            &json!({"partner_id": partner, "currency": "USDT", "amount": amount,
                                    "fee": "0.5", "tx_hash": tx_hash,
                                    "to_address": format!("0xaddress{i}")}),
                            Fixture::Deposit { tx_hash },
                        )
                        .await
                    else {
                        return Ok(());
                    };
                    let body = json!({"deposit_id": deposit});
                    let _ = client
                        .copies(
                            &tally,
                            copies,
                            Signer::ChainMonitor,
                            "/v1/chain-monitor/deposit-confirmations",
                            &body,
                        )
                        .await;
                } else {
                    let to_address = format!("0xaddress{i}");
                    let Ok(withdrawal) = client
                        .create_fixture(
                            &tally,
                            "/v1/admin/withdrawals",
                            &json!({"partner_id": partner, "status": "BROADCASTING",
                                    "currency": "USDT", "amount": amount,
                                    "to_address": to_address}),
                            Fixture::Withdrawal { to_address },
                        )
                        .await
                    else {
                        return Ok(());
                    };
                    let body = json!({"withdrawal_id": withdrawal,
                                  "tx_hash": format!("0xwithdrawal{i}")});
                    let _ = client
                        .copies(
                            &tally,
                            copies,
                            Signer::ChainMonitor,
                            "/v1/chain-monitor/withdrawal-confirmations",
                            &body,
                        )
                        .await;
                }
                Ok(())
            }
        })
        .await
}

const GATEWAYS: [(&str, &str); 5] = [
    ("PG", "pg"),
    ("PAYVERSE", "payverse"),
    ("HECTO", "hecto"),
    ("GOOGLE_IAP", "google-iap"),
    ("APPLE_IAP", "apple-iap"),
];

/// W3: charges of every gateway completed through its webhook and its verify call (copies
/// alternate between the two), under an active charge event and the first-charge bonus, so
/// each completion writes bonus jobs for grant-bonus. Members have several charges each, so
/// grants to one member race.
async fn payment_completions(
    profile: &Profile,
    client: &Client,
    schedule: Schedule,
    tally: Arc<Tally>,
) -> anyhow::Result<usize> {
    let now = chrono::Utc::now();
    client
        .create_fixture(
            &tally,
            "/v1/admin/charge-events",
            &json!({"title": "chaos event", "add_percent": 20,
                    "start_at": now - chrono::Duration::hours(1),
                    "end_at": now + chrono::Duration::days(1),
                    "available_count": 1_000_000}),
            Fixture::ChargeEvent {
                title: "chaos event".to_owned(),
            },
        )
        .await?;
    let members = (schedule.setup_items() / 8).max(3);
    let mut member_ids = Vec::with_capacity(members);
    for m in 0..members {
        let nickname = format!("chaos{m}");
        member_ids.push(
            client
                .create_fixture(
                    &tally,
                    "/v1/admin/members",
                    &json!({"nickname": nickname}),
                    Fixture::Member { nickname },
                )
                .await?,
        );
    }
    let member_ids = Arc::new(member_ids);
    let (client, copies) = (client.clone(), profile.copies);
    schedule
        .send(profile.concurrency, move |i| {
            let (client, tally, member_ids) = (client.clone(), tally.clone(), member_ids.clone());
            async move {
                let (gateway, path) = GATEWAYS[i % GATEWAYS.len()];
                let price = format!("{}", 1_000 + i % 7 * 100);
                let member_id = member_ids[i % member_ids.len()];
                let method = format!("card {i}");
                let Ok(charge) = client
                    .create_fixture(
                        &tally,
                        "/v1/admin/charges",
                        &json!({"member_id": member_id, "cans": 10 + i % 5, "price": price,
                                "payment_gateway": gateway, "method": method}),
                        Fixture::Purchase { member_id, method },
                    )
                    .await
                else {
                    return Ok(());
                };
                let body = json!({"charge_id": charge, "gateway_tx_id": format!("gw-{i}"),
                              "amount": price});
                let calls = (0..copies).map(|copy| {
                    let call = if copy % 2 == 0 { "webhook" } else { "verify" };
                    let url = format!("/v1/payments/{path}/{call}");
                    let (client, tally, body) = (client.clone(), tally.clone(), body.clone());
                    async move {
                        client
                            .call(&tally, Signer::PaymentService, Method::POST, &url, &body)
                            .await
                    }
                });
                futures_util::future::join_all(calls).await;
                Ok(())
            }
        })
        .await
}

/// W4: clients place orders on several markets (and fill one in three, in full or in part);
/// when half of a market's orders are placed, ops suspend it (`copies` suspend calls at once)
/// while the clients go on placing (refused from then on) and filling. Each market takes the
/// orders of the profile's [`MarketCadence`] in turn, so suspensions (and their cancels)
/// spread over the run. A market whose half was never
/// placed (the deadline came first) is suspended at the end. The orders sent and the markets.
async fn market_orders(
    profile: &Profile,
    client: &Client,
    schedule: Schedule,
    tally: Arc<Tally>,
) -> anyhow::Result<(usize, usize)> {
    let orders = schedule.items;
    let cadence = profile.markets;
    let per_market =
        ((schedule.pace.per_second * cadence.lifetime.as_secs_f64()) as usize).max(cadence.orders);
    let markets = orders.div_ceil(per_market).max(2);
    let mut symbols = Vec::with_capacity(markets);
    for m in 0..markets {
        let symbol = format!("CHAOS{m}");
        client
            .create_fixture(
                &tally,
                "/v1/admin/markets",
                &json!({"symbol": symbol}),
                Fixture::Market {
                    symbol: symbol.clone(),
                },
            )
            .await?;
        symbols.push(symbol);
    }
    let symbols = Arc::new(symbols);
    let placed: Arc<Vec<AtomicUsize>> =
        Arc::new((0..markets).map(|_| AtomicUsize::new(0)).collect());
    let (client, copies) = (client.clone(), profile.copies);
    let suspends = Arc::new(Mutex::new(Vec::new()));
    let sent = schedule.send(profile.concurrency, {
        let (client, tally, symbols, placed, suspends) = (
            client.clone(),
            tally.clone(),
            symbols.clone(),
            placed.clone(),
            suspends.clone(),
        );
        move |i| {
            let (client, tally, symbols, placed, suspends) = (
                client.clone(),
                tally.clone(),
                symbols.clone(),
                placed.clone(),
                suspends.clone(),
            );
            async move {
                let market = (i / per_market).min(symbols.len() - 1);
                let symbol = &symbols[market];
                if placed[market].fetch_add(1, Ordering::SeqCst) == per_market / 2 {
                    let (client, tally, symbol) = (client.clone(), tally.clone(), symbol.clone());
                    suspends
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(tokio::spawn(async move {
                            let path = format!("/v1/admin/markets/{symbol}/suspend");
                            let _ = client
                                .copies(&tally, copies, Signer::Admin, &path, &json!({"note": "chaos"}))
                                .await;
                        }));
                }
                let side = if i % 2 == 0 { "BUY" } else { "SELL" };
                let Ok((201, order)) = client
                    .call(
                        &tally,
                        Signer::Admin,
                        Method::POST,
                        &format!("/v1/admin/markets/{symbol}/orders"),
                        &json!({"account_id": i + 1, "side": side, "price": "100", "quantity": "10"}),
                    )
                    .await
                else {
                    // Refused: the market is suspended (or the call was lost, tallied).
                    return Ok(());
                };
                if i % 3 == 0 {
                    let quantity = if i % 2 == 0 { "10" } else { "4" };
                    let path = format!("/v1/admin/orders/{}/fills", id_of(&order)?);
                    let _ = client
                        .call(&tally, Signer::Admin, Method::POST, &path, &json!({"quantity": quantity}))
                        .await;
                }
                Ok(())
            }
        }
    })
    .await?;
    let pending: Vec<_> = std::mem::take(&mut *suspends.lock().unwrap_or_else(|p| p.into_inner()));
    for suspend in pending {
        suspend.await?;
    }
    for (symbol, placed) in symbols.iter().zip(placed.iter()) {
        if placed.load(Ordering::SeqCst) <= per_market / 2 {
            let path = format!("/v1/admin/markets/{symbol}/suspend");
            let _ = client
                .copies(
                    &tally,
                    copies,
                    Signer::Admin,
                    &path,
                    &json!({"note": "chaos"}),
                )
                .await;
        }
    }
    Ok((sent, markets))
}
