//! What surrounds paybus in a chaos run: the quote service (slow, failing, timing out), the
//! partners' webhook endpoint (failing for a while) and the HTTP API the clients call;
//! `faults` is the schedule that breaks them and the rest.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use paybus_api::{ApiConfig, AppState, auth::Role};
use paybus_p2p::testing::QuoteStub;
use paybus_platform::{bus::Services, config::Vars};
use tokio_util::sync::CancellationToken;
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

/// The partners' webhook endpoint: 200, or 503 while an outage lasts.
#[derive(Clone, Default)]
pub(crate) struct Webhooks {
    /// Milliseconds since `epoch` until which every POST is refused.
    failing_until_ms: Arc<AtomicU64>,
    epoch: Arc<Mutex<Option<Instant>>>,
    posts: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
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

    pub(crate) fn posts(&self) -> u64 {
        self.posts.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Respond for Webhooks {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        self.posts.fetch_add(1, Ordering::Relaxed);
        if self.now_ms() < self.failing_until_ms.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return ResponseTemplate::new(503).set_body_string("partner endpoint down");
        }
        ResponseTemplate::new(200)
    }
}

/// The stubs a run starts, shared by the load, the fault schedule and the report.
#[derive(Clone)]
pub(crate) struct World {
    pub(crate) quotes: Arc<QuoteStub>,
    pub(crate) webhooks: Webhooks,
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

/// The HTTP API, in this process (the clients' entry point; the functions are the processes
/// the schedule kills).
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) admin_token: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Api {
    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

pub(crate) async fn start_api(services: &Services, world: &World) -> anyhow::Result<Api> {
    let vars = Vars::new(
        [
            ("PAYBUS_CHAIN_MONITOR_SECRET", CHAIN_MONITOR_SECRET),
            ("PAYBUS_PAYMENTS_SECRET", PAYMENTS_SECRET),
            ("PAYBUS_ADMIN_JWT_SECRET", ADMIN_JWT_SECRET),
            ("PAYBUS_PARTNER_KEY_HASH_KEY", PARTNER_KEY_HASH_KEY),
            // Partner create seals the webhook secret.
            ("PAYBUS_SECRETS_KEY", paybus_platform::testing::SECRETS_KEY),
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
        .collect(),
    );
    let config = ApiConfig::read(&vars)?;
    let state = AppState::new(services, &config, paybus_catalog::audit_checks())?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            if let Err(e) = paybus_api::serve_on(listener, state, stop).await {
                tracing::error!(error = %e, "the chaos run's HTTP API stopped");
            }
        }
    });
    let admin_token = paybus_api::auth::issue(
        ADMIN_JWT_SECRET,
        "chaos",
        &[Role::Admin],
        Duration::from_secs(24 * 3600),
    )?;
    Ok(Api {
        base,
        admin_token,
        stop,
        task,
    })
}
