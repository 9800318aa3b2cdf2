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
    network::{NetFault, Network, Peer},
    outside::{API_PROCESS, QUOTE_DELAY, QUOTE_TIMEOUT, World},
};

/// How a broker node kill is named in the fault log (the report counts them by it).
pub(super) const BROKER_NODE_KILL: &str = "broker node SIGKILL";

/// How late a late answer comes: half a second past the client's timeout (the client gave up
/// well before it), far inside the zombie timeout.
pub(super) const LATE_ANSWER: Duration = QUOTE_TIMEOUT.saturating_add(Duration::from_millis(500));

/// One fault, as the report lists it.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// Seconds since the load started.
    pub at_s: f64,
    pub what: String,
    pub took_ms: u64,
    /// How long it held, for a fault that holds (a partition, an outage, a slow phase).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lasts_ms: Option<u64>,
}

/// The functions that move money: where a reset right after COMMIT matters most.
const MONEY_MOVERS: [&str; 4] = [
    "confirm-withdrawal",
    "confirm-deposit",
    "grant-bonus",
    "match-deposit",
];

/// The run's network and its function processes by slot (process `i` lives in slot `i`).
pub(super) struct Net {
    pub(super) network: Arc<Network>,
    pub(super) slots: Vec<String>,
}

impl Net {
    fn slot_of(&self, name: &str) -> Option<usize> {
        self.slots.iter().position(|n| n == name)
    }
}

/// What the schedule does between the functions and the database or broker, as fractions of
/// the fault window. The quick profile (CI) gets one of each kind, a partition from the
/// database among them; the full profile adds a partition from the broker, latency on a
/// second process and resets after COMMIT in every money mover.
#[derive(Debug, Clone, Copy)]
enum NetStep {
    Latency(Peer),
    Loss,
    Partition(Peer),
    ResetAfterCommit { every_money_mover: bool },
    KillSockets(Peer),
}

fn network_plan(profile: &Profile) -> Vec<(f64, NetStep)> {
    let mut plan: Vec<(f64, NetStep)> = vec![
        (0.10, NetStep::Latency(Peer::Database)),
        (0.20, NetStep::Loss),
        (0.30, NetStep::Partition(Peer::Database)),
        (
            0.50,
            NetStep::ResetAfterCommit {
                every_money_mover: false,
            },
        ),
        (0.60, NetStep::KillSockets(Peer::Database)),
    ];
    if profile.name == "full" {
        plan.extend([
            (0.15, NetStep::Latency(Peer::Broker)),
            (0.55, NetStep::Partition(Peer::Broker)),
            (0.65, NetStep::KillSockets(Peer::Broker)),
            (
                0.70,
                NetStep::ResetAfterCommit {
                    every_money_mover: true,
                },
            ),
        ]);
    }
    plan.sort_by(|a, b| a.0.total_cmp(&b.0));
    plan
}

/// Applies one network step; what it did (a step may touch several processes).
async fn apply(step: NetStep, profile: &Profile, net: &Net, dice: &mut Dice) -> Vec<NetFault> {
    let random_slot = |dice: &mut Dice| dice.below(net.slots.len());
    let hold = profile.partition.min(profile.fault_window / 3);
    let network = &net.network;
    match step {
        NetStep::Latency(peer) => {
            let slot = random_slot(dice);
            // The relay delays the whole slot; netem the slot's link: either way both peers
            // of a process that talks to both.
            let _ = peer;
            vec![
                network
                    .latency(
                        slot,
                        Duration::from_millis(200),
                        Duration::from_millis(50),
                        hold,
                    )
                    .await,
            ]
        }
        NetStep::Loss => vec![network.loss(random_slot(dice), 5, hold).await],
        NetStep::Partition(peer) => {
            vec![
                network
                    .partition(random_slot(dice), peer, profile.partition)
                    .await,
            ]
        }
        NetStep::ResetAfterCommit { every_money_mover } => {
            let slots: Vec<usize> = if every_money_mover {
                MONEY_MOVERS.iter().filter_map(|n| net.slot_of(n)).collect()
            } else {
                let movers: Vec<usize> =
                    MONEY_MOVERS.iter().filter_map(|n| net.slot_of(n)).collect();
                movers
                    .get(dice.below(movers.len().max(1)))
                    .copied()
                    .into_iter()
                    .collect()
            };
            let mut done = Vec::new();
            for slot in slots {
                done.push(network.reset_after_commit(slot, 2).await);
            }
            done
        }
        NetStep::KillSockets(peer) => {
            // A process restarting (killed, or partitioned a moment ago) may hold none: try
            // the others in turn until one had some to lose.
            let first = random_slot(dice);
            let mut tried = Vec::new();
            for n in 0..net.slots.len() {
                let fault = network
                    .kill_sockets((first + n) % net.slots.len(), peer)
                    .await;
                let cut = fault.cut.unwrap_or(0) > 0 || fault.failed();
                tried.push(fault);
                if cut {
                    break;
                }
            }
            tried.split_off(tried.len().saturating_sub(1))
        }
    }
}

/// The fault schedule, until `stop`: a SIGKILL of a random function process every
/// `kill_every` (its supervisor restarts it at once), the broker restarts, broker node kills
/// and database restarts spread evenly over the fault window, the webhook outage at a quarter
/// of it, the first `profile.late_trades_first` trades answered after the client's timeout, and the
/// quote service alternating between healthy, failing (503s, 500s without a trade, a 422
/// refusal), trading then answering after the client's timeout, and slow. Returns what it
/// did.
pub(super) async fn run(
    profile: Profile,
    fleet: Arc<Fleet>,
    mariadb: Arc<PrivateService>,
    rabbitmq: Arc<OwnBroker>,
    world: World,
    net: Option<Net>,
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
            lasts_ms: None,
        });
    };
    let mut network_steps = match &net {
        Some(_) if profile.network_faults => network_plan(&profile).into_iter().peekable(),
        _ => Vec::new().into_iter().peekable(),
    };
    // The API process is killed at least once mid-load (the random kills may miss it).
    let mut api_kill_at = Some(profile.fault_window.mul_f64(0.4));
    let late_webhooks_at = profile.fault_window.mul_f64(0.7);
    let mut late_webhooks_done = profile.late_webhooks == 0;
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
        .answer_next_trades_after(profile.late_trades_first, LATE_ANSWER);
    record(
        format!(
            "quote service: the first {} trades answered after the client's timeout",
            profile.late_trades_first
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
        while let (Some(net), Some(&(at, step))) = (&net, network_steps.peek()) {
            if now < profile.fault_window.mul_f64(at) {
                break;
            }
            network_steps.next();
            for fault in apply(step, &profile, net, &mut dice).await {
                log.push(Fault {
                    at_s: (started.elapsed().as_secs_f64() - fault.took_ms as f64 / 1000.0)
                        .max(0.0),
                    // A failure is the stage's finding (with those that did not end).
                    what: format!("network: {fault}"),
                    took_ms: fault.took_ms,
                    lasts_ms: fault.lasts_ms,
                });
            }
        }
        if api_kill_at.is_some_and(|at| now >= at) {
            api_kill_at = None;
            if let Some(name) = fleet.kill_named(API_PROCESS).await {
                record(format!("SIGKILL {name}"), Duration::ZERO, &mut log);
            }
        }
        if !late_webhooks_done && now >= late_webhooks_at {
            late_webhooks_done = true;
            world.webhooks.answer_next_late(profile.late_webhooks);
            record(
                format!(
                    "partner webhook endpoint takes the next {} notifications, answers after the sender's timeout",
                    profile.late_webhooks
                ),
                Duration::ZERO,
                &mut log,
            );
        }
        if !webhook_outage_done && now >= webhook_outage_at {
            webhook_outage_done = true;
            world.webhooks.fail_for(profile.webhook_outage);
            log.push(Fault {
                at_s: started.elapsed().as_secs_f64(),
                what: "partner webhook endpoint answers 503".to_owned(),
                took_ms: 0,
                lasts_ms: Some(profile.webhook_outage.as_millis() as u64),
            });
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
            // Down from the kill until it answers again.
            lasts_ms: Some(began.elapsed().as_millis() as u64),
        });
    }
    log
}
