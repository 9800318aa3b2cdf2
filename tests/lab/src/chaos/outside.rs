//! What surrounds paybus in a chaos run: the quote service (slow, failing, timing out), the
//! partners' webhook endpoint (failing for a while), the HTTP API the clients call, and the
//! fault schedule that breaks the rest.

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
use paybus_platform::{bus::Services, config::Vars, testing::PrivateService};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate, matchers::method};

use super::{Dice, Profile, broker::OwnBroker, fleet::Fleet};

/// How a broker node kill is named in the fault log (the report counts them by it).
pub(super) const BROKER_NODE_KILL: &str = "broker node SIGKILL";

pub(super) const CHAIN_MONITOR_SECRET: &str = "chaos-chain-monitor-secret";
pub(super) const PAYMENTS_SECRET: &str = "chaos-payment-service-secret";
const ADMIN_JWT_SECRET: &str = "chaos-admin-jwt-secret-of-32-chars-or-more";
pub(super) const QUOTE_API_KEY: &str = "chaos-quote-api-key";
/// One quote service call; a createTrade slower than this is a timeout.
pub(super) const QUOTE_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long the quote service takes when it is healthy.
const QUOTE_DELAY: Duration = Duration::from_millis(30);

/// The partners' webhook endpoint: 200, or 503 while an outage lasts.
#[derive(Clone, Default)]
pub(super) struct Webhooks {
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

    pub(super) fn fail_for(&self, outage: Duration) {
        let until = self.now_ms() + outage.as_millis() as u64;
        self.failing_until_ms.store(until, Ordering::SeqCst);
    }

    pub(super) fn posts(&self) -> u64 {
        self.posts.load(Ordering::Relaxed)
    }

    pub(super) fn refused(&self) -> u64 {
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
pub(super) struct World {
    pub(super) quotes: Arc<QuoteStub>,
    pub(super) webhooks: Webhooks,
    pub(super) webhook_url: String,
    _webhook_server: Arc<MockServer>,
}

impl World {
    pub(super) async fn start(_profile: &Profile) -> Self {
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
pub(super) struct Api {
    pub(super) base: String,
    pub(super) admin_token: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Api {
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

pub(super) async fn start_api(services: &Services, world: &World) -> anyhow::Result<Api> {
    let vars = Vars::new(
        [
            ("PAYBUS_CHAIN_MONITOR_SECRET", CHAIN_MONITOR_SECRET),
            ("PAYBUS_PAYMENTS_SECRET", PAYMENTS_SECRET),
            ("PAYBUS_ADMIN_JWT_SECRET", ADMIN_JWT_SECRET),
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

/// One fault, as the report lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// Seconds since the load started.
    pub at_s: f64,
    pub what: String,
    pub took_ms: u64,
}

/// The fault schedule, until `stop`: a SIGKILL of a random function process every
/// `kill_every` (its supervisor restarts it at once), the broker restarts, broker node kills
/// and database restarts spread evenly over the fault window, the webhook outage at a quarter
/// of it, and the quote service alternating between healthy, failing (503s, 500s without a
/// trade, a 422 refusal), trading then answering after the client's timeout, and slow.
/// Returns what it did.
pub(super) async fn faults(
    profile: Profile,
    fleet: Arc<Fleet>,
    mariadb: Arc<PrivateService>,
    rabbitmq: Arc<OwnBroker>,
    world: World,
    stop: CancellationToken,
) -> Vec<Fault> {
    let started = Instant::now();
    let mut dice = Dice::new(profile.seed);
    let mut log = Vec::new();
    let record = |what: String, took: Duration, log: &mut Vec<Fault>| {
        log.push(Fault {
            at_s: (started.elapsed() - took).as_secs_f64(),
            what,
            took_ms: took.as_millis() as u64,
        });
    };
    // (when, which) of the service restarts, in time order.
    let mut restarts: Vec<(Duration, Restart)> = Vec::new();
    let spread = |n: u32, offset: f64| {
        (0..n).map(move |i| {
            profile
                .fault_window
                .mul_f64((f64::from(i) + offset) / f64::from(n))
        })
    };
    restarts.extend(spread(profile.broker_restarts, 0.3).map(|at| (at, Restart::Broker)));
    restarts
        .extend(spread(profile.broker_node_kills, 0.45).map(|at| (at, Restart::BrokerNodeKill)));
    restarts.extend(spread(profile.database_restarts, 0.6).map(|at| (at, Restart::Database)));
    restarts.sort_by_key(|(at, _)| *at);
    // Restarts take a while (a clean RabbitMQ stop of quorum queues, InnoDB recovery): they run
    // on their own schedule, so the kills go on meanwhile, and every one of them happens even
    // when it ends after the window. One at a time: never two broker nodes down at once, so a
    // majority of the cluster always stands.
    let restarter = tokio::spawn(restart_on_schedule(
        restarts,
        mariadb,
        rabbitmq,
        Dice::new(profile.seed.rotate_left(17)),
        started,
    ));
    let webhook_outage_at = profile.fault_window / 4;
    let mut webhook_outage_done = profile.webhook_outage.is_zero();
    let tick = Duration::from_millis(250);
    let mut next_kill = profile.kill_every;
    let mut next_quote_change = Duration::from_secs(2);
    let mut quote_phase = 0_usize;
    while !stop.is_cancelled() {
        let now = started.elapsed();
        if !profile.kill_every.is_zero() && now >= next_kill {
            next_kill = now + profile.kill_every;
            if let Some(name) = fleet.kill_random(&mut dice).await {
                record(format!("SIGKILL {name}"), Duration::ZERO, &mut log);
            }
        }
        if !webhook_outage_done && now >= webhook_outage_at {
            webhook_outage_done = true;
            world.webhooks.fail_for(profile.webhook_outage);
            record(
                format!(
                    "partner webhook endpoint answers 503 for {:?}",
                    profile.webhook_outage
                ),
                Duration::ZERO,
                &mut log,
            );
        }
        if now >= next_quote_change {
            next_quote_change = now + Duration::from_secs(3);
            quote_phase += 1;
            let what = match quote_phase % 4 {
                1 => {
                    world.quotes.fail_next_quotes(3);
                    world.quotes.fail_next_trades(2);
                    world.quotes.refuse_next_trades(1);
                    "quote service: next 3 quotes 503, next 2 trades 500 (not traded), then one 422"
                }
                2 => {
                    world
                        .quotes
                        .set_trade_delay(QUOTE_TIMEOUT + QUOTE_TIMEOUT / 2);
                    "quote service: trades, then answers createTrade after the client's timeout"
                }
                3 => {
                    world.quotes.set_trade_delay(QUOTE_TIMEOUT / 2);
                    "quote service: slow (half the timeout)"
                }
                _ => {
                    world.quotes.set_trade_delay(QUOTE_DELAY);
                    "quote service: healthy"
                }
            };
            record(what.to_owned(), Duration::ZERO, &mut log);
        }
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(tick) => {}
        }
    }
    world.quotes.set_trade_delay(QUOTE_DELAY);
    if let Ok(restarts) = restarter.await {
        log.extend(restarts);
    }
    log.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    log
}

#[derive(Debug, Clone, Copy)]
enum Restart {
    /// A clean stop and start of a broker node (a single node: the broker).
    Broker,
    /// SIGKILL of a random node of the cluster, then a start (it rejoins).
    BrokerNodeKill,
    /// SIGKILL of the database, then a start (InnoDB recovery).
    Database,
}

async fn restart_on_schedule(
    schedule: Vec<(Duration, Restart)>,
    mariadb: Arc<PrivateService>,
    rabbitmq: Arc<OwnBroker>,
    mut dice: Dice,
    started: Instant,
) -> Vec<Fault> {
    let mut log = Vec::new();
    let nodes = rabbitmq.nodes();
    let mut broker_restarts = 0;
    for (at, restart) in schedule {
        tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
        let began = Instant::now();
        // The broker's restarts are clean (a single RabbitMQ 3.10 node sometimes elects no
        // quorum leader after a SIGKILL); its crashes are node kills, on a cluster only.
        let (what, apply): (String, Box<dyn FnOnce() + Send>) = match restart {
            Restart::Broker => {
                let node = broker_restarts % nodes + 1;
                broker_restarts += 1;
                let rabbitmq = rabbitmq.clone();
                let what = if nodes == 1 {
                    "broker restart".to_owned()
                } else {
                    format!("broker restart (node {node})")
                };
                (what, Box::new(move || rabbitmq.restart_node(node)))
            }
            Restart::BrokerNodeKill => {
                let node = dice.below(nodes) + 1;
                let rabbitmq = rabbitmq.clone();
                (
                    format!("{BROKER_NODE_KILL} (node {node}), started again"),
                    Box::new(move || rabbitmq.crash_node(node)),
                )
            }
            Restart::Database => {
                let mariadb = mariadb.clone();
                (
                    "database restart (SIGKILL)".to_owned(),
                    Box::new(move || mariadb.restart(true)),
                )
            }
        };
        let outcome = tokio::task::spawn_blocking(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(apply))
        })
        .await;
        let ok = matches!(outcome, Ok(Ok(())));
        log.push(Fault {
            at_s: (began - started).as_secs_f64(),
            what: format!("{what}{}", if ok { "" } else { " FAILED" }),
            took_ms: began.elapsed().as_millis() as u64,
        });
    }
    log
}
