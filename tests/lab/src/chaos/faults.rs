//! The fault schedule of a chaos run: what breaks the function processes, the broker, the
//! database, the quote service and the partners' webhook endpoint, and when.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use paybus_lab::services::PrivateService;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{
    Dice, Profile,
    broker::OwnBroker,
    fleet::Fleet,
    outside::{QUOTE_DELAY, QUOTE_TIMEOUT, World},
};

/// How a broker node kill is named in the fault log (the report counts them by it).
pub(super) const BROKER_NODE_KILL: &str = "broker node SIGKILL";

/// The first trades of every run answered after the client's timeout, having been made: the
/// phases alone may come while no createTrade is in flight (a quick run's orders can all be
/// matched before the first late phase), and a run without a late trade would pass without
/// testing principle 12's *unknown*. Five, so that some of them are match-deposit's own first
/// calls: the sweeper's due-orders job makes some attempts too, and its re-asks of fills in
/// doubt (the failing phase's 500s, 2 s later) can take some of the five.
const LATE_TRADES_FIRST: u32 = 5;
/// How late a late answer comes: half a second past the client's timeout (the client gave up
/// well before it), far inside the zombie timeout.
const LATE_ANSWER: Duration = QUOTE_TIMEOUT.saturating_add(Duration::from_millis(500));

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
/// of it, the first [`LATE_TRADES_FIRST`] trades answered after the client's timeout, and the
/// quote service alternating between healthy, failing (503s, 500s without a trade, a 422
/// refusal), trading then answering after the client's timeout, and slow. Returns what it
/// did.
pub(super) async fn run(
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
    world
        .quotes
        .answer_next_trades_after(LATE_TRADES_FIRST, LATE_ANSWER);
    record(
        format!(
            "quote service: the first {LATE_TRADES_FIRST} trades answered after the client's timeout"
        ),
        Duration::ZERO,
        &mut log,
    );
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
                    world.quotes.set_trade_delay(LATE_ANSWER);
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
