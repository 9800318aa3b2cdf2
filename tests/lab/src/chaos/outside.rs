//! What surrounds paybus in a chaos run: the quote service (slow, failing, trading then
//! answering too late), the partners' webhook endpoint (failing for a while, taking
//! notifications then answering too late) and the HTTP API the clients call; `faults` is the
//! schedule that breaks them and the rest.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use paybus_api::role::Role;
use paybus_testkit::p2p::QuoteStub;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate, matchers::method};

use super::Profile;

pub(crate) const CHAIN_MONITOR_SECRET: &str = "chaos-chain-monitor-secret";
pub(crate) const PAYMENTS_SECRET: &str = "chaos-payment-service-secret";
const ADMIN_JWT_SECRET: &str = "chaos-admin-jwt-secret-of-32-chars-or-more";
const PARTNER_KEY_HASH_KEY: &str = "chaos-partner-key-hash-key-of-32-chars-or-more";
pub(crate) const QUOTE_API_KEY: &str = "chaos-quote-api-key";
/// One quote service call; a createTrade slower than this is a timeout.
pub(crate) const QUOTE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long the quote service takes when it is healthy.
pub(crate) const QUOTE_DELAY: Duration = Duration::from_millis(30);
/// How long deliver-webhook waits for a partner's answer (`PAYBUS_WEBHOOK_TIMEOUT_MS`).
pub(crate) const WEBHOOK_TIMEOUT: Duration = Duration::from_millis(2_000);

/// One POST the partners' endpoint received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// `webhook-id`: the notification's id, the partner's idempotency key.
    pub(crate) webhook_id: String,
    /// `x-paybus-event` and the body: what the notification says.
    pub(crate) event: String,
    pub(crate) payload: Vec<u8>,
    /// The answer it got (200 also when it came after the sender's timeout).
    pub(crate) status: u16,
    /// Answered after the sender's timeout.
    pub(crate) late: bool,
}

/// The partners' webhook endpoint: 200; 503 while an outage lasts; and, for the POSTs it is
/// told to answer late, 200 only after the sender's timeout — it took the notification (a partner that acted on
/// it), but the sender cannot know, so the notification must come again under the same id.
/// Every POST is recorded for the checks.
#[derive(Clone, Default)]
pub(crate) struct Webhooks {
    /// Milliseconds since `epoch` until which every POST is refused.
    failing_until_ms: Arc<AtomicU64>,
    /// POSTs still to answer late.
    late_left: Arc<AtomicU64>,
    epoch: Arc<Mutex<Option<Instant>>>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Webhooks {
    fn now_ms(&self) -> u64 {
        let mut epoch = self.epoch.lock().unwrap_or_else(|p| p.into_inner());
        epoch.get_or_insert_with(Instant::now).elapsed().as_millis() as u64
    }

    pub(crate) fn fail_for(&self, outage: Duration) {
        let until = self.now_ms() + outage.as_millis() as u64;
        self.failing_until_ms.store(until, Ordering::SeqCst);
    }

    /// Answers the next `posts` POSTs after the sender's timeout (counted, not timed: the
    /// deliveries come when the broker and deliver-webhook let them, and each must meet it).
    pub(crate) fn answer_next_late(&self, posts: u64) {
        self.late_left.store(posts, Ordering::SeqCst);
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn posts(&self) -> u64 {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len() as u64
    }

    pub(crate) fn refused(&self) -> u64 {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|r| r.status >= 300)
            .count() as u64
    }
}

impl Respond for Webhooks {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let header = |name: &str| {
            request
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let now = self.now_ms();
        let (status, delay) = if now < self.failing_until_ms.load(Ordering::SeqCst) {
            (503, Duration::ZERO)
        } else if self
            .late_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            (200, WEBHOOK_TIMEOUT + WEBHOOK_TIMEOUT / 2)
        } else {
            (200, Duration::ZERO)
        };
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Received {
                webhook_id: header("webhook-id"),
                event: header("x-paybus-event"),
                payload: request.body.clone(),
                status,
                late: !delay.is_zero(),
            });
        let answer = if status == 503 {
            ResponseTemplate::new(503).set_body_string("partner endpoint down")
        } else {
            ResponseTemplate::new(200)
        };
        answer.set_delay(delay)
    }
}

/// The stubs a run starts, shared by the load, the fault schedule and the report.
#[derive(Clone)]
pub(crate) struct World {
    pub(crate) quotes: Arc<QuoteStub>,
    pub(crate) webhooks: Webhooks,
    /// Where partners' webhooks go, as the function processes reach it (through the run's
    /// relay when they live in network namespaces).
    pub(crate) webhook_url: String,
    _webhook_server: Arc<MockServer>,
}

impl World {
    pub(crate) async fn start(_profile: &Profile) -> Self {
        let quotes = Arc::new(QuoteStub::with_delay(QUOTE_DELAY).await);
        let webhooks = Webhooks::default();
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(webhooks.clone())
            .mount(&server)
            .await;
        Self {
            quotes,
            webhook_url: format!("{}/paybus-webhooks", server.uri()),
            webhooks,
            _webhook_server: Arc::new(server),
        }
    }
}

/// The name of the HTTP API's process in the fleet (`paybus serve`).
pub(crate) const API_PROCESS: &str = "api";

/// The HTTP API the clients call: `paybus serve` as a process of its own, which the schedule
/// SIGKILLs like the functions (its supervisor starts it again on the same address).
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) admin_token: String,
}

impl Api {
    /// The API on `addr` (free: the process binds it), and an ADMIN token it accepts.
    pub(crate) fn on(addr: SocketAddr) -> anyhow::Result<Self> {
        let admin_token = paybus_api::auth::issue(
            ADMIN_JWT_SECRET,
            "chaos",
            &[Role::Admin],
            Duration::from_secs(24 * 3600),
        )?;
        Ok(Self {
            base: format!("http://{addr}"),
            admin_token,
        })
    }

    /// The API process's settings (beside the database and broker ones every process has).
    pub(crate) fn environment(&self, world: &World) -> HashMap<String, String> {
        let addr = self.base.trim_start_matches("http://").to_owned();
        [
            ("PAYBUS_HTTP_ADDR", addr.as_str()),
            ("PAYBUS_CHAIN_MONITOR_SECRET", CHAIN_MONITOR_SECRET),
            ("PAYBUS_PAYMENTS_SECRET", PAYMENTS_SECRET),
            ("PAYBUS_ADMIN_JWT_SECRET", ADMIN_JWT_SECRET),
            ("PAYBUS_BREAK_GLASS", "true"),
            ("PAYBUS_PARTNER_KEY_HASH_KEY", PARTNER_KEY_HASH_KEY),
            // Partner create seals the webhook secret.
            ("PAYBUS_SECRETS_KEY", paybus_testkit::SECRETS_KEY),
            // The load is one buyer partner at the run's concurrency: its limit must not be
            // what the run measures.
            ("PAYBUS_PARTNER_RATE_LIMIT_PER_SECOND", "100000"),
            ("PAYBUS_PARTNER_RATE_LIMIT_BURST", "100000"),
            ("PAYBUS_ASYNC_MATCHING_ENABLED", "true"),
            ("PAYBUS_FIRST_CHARGE_BONUS_PERCENT", "10"),
            ("PAYBUS_QUOTE_URL", &world.quotes.url()),
            ("PAYBUS_QUOTE_API_KEY", QUOTE_API_KEY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Waits until the API answers `/health` (a process just started, or started again).
    pub(crate) async fn ready(&self, within: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + within;
        loop {
            let answer = client
                .get(format!("{}/health", self.base))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            match answer {
                Ok(response) if response.status().is_success() => return Ok(()),
                _ if Instant::now() >= deadline => {
                    anyhow::bail!("the API at {} did not answer within {within:?}", self.base)
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}
