//! The stage a run plays on, shared by chaos and the soak (`bench soak`): on the run's own
//! services, a fresh database with the migrations and the topology, the quote service stub
//! and the partner webhook endpoint, the duplicator, the timeline's watch (queue depth and
//! fills in doubt every second), and every function and the HTTP API as processes of their
//! own — with the run's network (chaos), each function in a network namespace whose database,
//! broker and HTTP peers are relayed, so the schedule can break what is between them.
//! [`Stage::finish`] is the common ending: quiescence, every process stopped, the network
//! taken down, then the exactly-once checks.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use paybus_bus::Services;
use paybus_testkit::free_port;
use tokio_util::sync::CancellationToken;

use super::{
    OwnServices, Profile,
    checks::{self, DeadLetters, Violation},
    deploy,
    duplicator::Duplicator,
    fleet::{self, Fleet, ProcessRecord, ProcessSpec},
    load::Load,
    network::{Network, NetworkOptions, Peer},
    outside::{Api, World},
    report::NetworkFigures,
    timeline::{Recording, Watch},
};

/// Whose migrations and topology the run's database and broker start with.
pub(crate) enum Schema<'a> {
    /// This build's, applied in process.
    Current,
    /// A release's, by its own `paybus migrate` and `paybus topology`: an upgrade starts on it.
    Release(&'a deploy::Side),
}

/// How long the API process may take to answer after its start.
const API_START_WITHIN: Duration = Duration::from_secs(60);

/// How long the harness's own parts (the duplicator, the API) may take to stop.
const STOP_WITHIN: Duration = Duration::from_secs(30);

pub(crate) struct Stage {
    pub(crate) services: Services,
    pub(crate) outside: World,
    pub(crate) api: Api,
    pub(crate) duplicator: Duplicator,
    pub(crate) watch: Watch,
    pub(crate) fleet: Arc<Fleet>,
    /// The run's network (chaos with network faults); none: every process on the host.
    pub(crate) network: Option<Arc<Network>>,
    /// The function processes by network slot (the API has none).
    pub(crate) slots: Vec<String>,
    stop: CancellationToken,
    /// When every process had been started (the run's clock).
    pub(crate) started: Instant,
    /// A minute before it, on the wall clock: where the quote reconciliation starts.
    pub(crate) started_at: chrono::DateTime<chrono::Utc>,
}

/// What [`Stage::finish`] found.
pub(crate) struct Ending {
    pub(crate) time_to_quiescence: Duration,
    pub(crate) process_exits: Vec<ProcessRecord>,
    pub(crate) violations: Vec<Violation>,
    pub(crate) counts: BTreeMap<String, BTreeMap<String, i64>>,
    pub(crate) dead_letters: Vec<DeadLetters>,
    /// The most messages ready in all queues at once, over the whole run.
    pub(crate) peak_queue_depth: u64,
    /// What the partners' endpoint received.
    pub(crate) webhooks: checks::WebhookFigures,
    /// What the network did: none without one.
    pub(crate) network: Option<NetworkFigures>,
    /// The timeline's samples, from the stage's start to its stop.
    pub(crate) recording: Recording,
    /// Events the tap saw, copies it published, malformed messages it injected.
    pub(crate) messages_seen: u64,
    pub(crate) copies_published: u64,
    pub(crate) malformed_injected: u64,
}

impl Stage {
    /// Sets the stage; with `network`, the functions live in namespaces of the run's network
    /// (or, where the machine cannot make them, behind its relays on the host).
    pub(crate) async fn start(
        profile: &Profile,
        own: &OwnServices,
        binaries: &[fleet::Binary],
        state_dir: &Path,
        network: bool,
        schema: Schema<'_>,
    ) -> anyhow::Result<Self> {
        let settings = own.settings(&profile.layout())?;
        let services = Services::connect(settings.clone())
            .await
            .context("while connecting to the run's own database and broker")?;
        match schema {
            Schema::Current => paybus_runtime::migrations::apply(&services.pool).await?,
            Schema::Release(side) => {
                deploy::migrate(side, &deploy::environment(&settings))
                    .await
                    .with_context(|| {
                        format!("while setting up release {}'s schema", side.release.version)
                    })?;
            }
        }
        services
            .declare_topology(&paybus_catalog::queues(&services.settings.broker.shards))
            .await?;

        let mut outside = World::start(profile).await;
        let stop = CancellationToken::new();
        let duplicator = Duplicator::start(&services, profile, stop.clone()).await?;
        let watch = Watch::start(&services, stop.clone());

        let mut env = fleet::environment(&settings, &outside);
        // Always set (empty: none sharded), so no value inherited from this shell applies.
        env.insert(
            paybus_config::Shards::VARIABLE.to_owned(),
            settings.broker.shards.to_string(),
        );
        // Each process its own order of the nodes: the connections spread over the cluster, so
        // any node's death moves some of them.
        let node_orders: Vec<String> = (1..=own.rabbitmq.nodes())
            .map(|first| {
                own.rabbitmq
                    .settings(&settings.broker, first)
                    .to_env_value()
            })
            .collect();
        let functions = binaries.iter().filter(|b| !b.is_api()).count();
        let network = if network {
            let network = Network::start(NetworkOptions {
                slots: functions,
                namespaces: true,
            })
            .await?;
            network
                .relay_url("mariadb", Peer::Database, &settings.database.url)
                .await?;
            for node in 1..=own.rabbitmq.nodes() {
                let url = own.rabbitmq.settings(&settings.broker, node).url;
                network
                    .relay_url(&format!("rabbitmq-{node}"), Peer::Broker, &url)
                    .await?;
            }
            network
                .relay_url("quotes", Peer::Http, &outside.quotes.url().parse()?)
                .await?;
            network
                .relay_url("webhooks", Peer::Http, &outside.webhook_url.parse()?)
                .await?;
            // Partners' webhook URLs are read from the database by whichever process
            // delivers.
            outside.webhook_url = network.rewrite(None, &outside.webhook_url);
            Some(Arc::new(network))
        } else {
            None
        };
        let api = Api::on(([127, 0, 0, 1], free_port()).into())?;
        let mut specs = Vec::with_capacity(binaries.len());
        let mut slots = Vec::with_capacity(functions);
        let mut slot = 0;
        for (i, binary) in binaries.iter().enumerate() {
            let mut env = env.clone();
            env.insert(
                "PAYBUS_AMQP_URL".to_owned(),
                node_orders[i % node_orders.len()].clone(),
            );
            let spec = if binary.is_api() {
                env.extend(api.environment(&outside));
                ProcessSpec {
                    binary: binary.clone(),
                    env,
                    slot: None,
                }
            } else {
                let this = slot;
                slot += 1;
                slots.push(binary.name.clone());
                if let Some(network) = &network {
                    for value in env.values_mut() {
                        *value = network.rewrite(Some(this), value);
                    }
                }
                ProcessSpec {
                    binary: binary.clone(),
                    env,
                    slot: Some(this),
                }
            };
            specs.push(spec);
        }
        let fleet = Arc::new(Fleet::start(specs, network.clone(), &state_dir.join("logs")).await?);
        api.ready(API_START_WITHIN).await?;
        Ok(Self {
            services,
            outside,
            api,
            duplicator,
            watch,
            fleet,
            network,
            slots,
            stop,
            started: Instant::now(),
            started_at: chrono::Utc::now() - chrono::Duration::minutes(1),
        })
    }

    /// Waits (at most `quiescence_timeout`) until nothing moves, stops every process and the
    /// harness's parts, then runs every exactly-once check on what is left.
    pub(crate) async fn finish(
        self,
        load: &Load,
        quiescence_timeout: Duration,
    ) -> anyhow::Result<Ending> {
        let Self {
            services,
            outside,
            duplicator,
            watch,
            fleet,
            network,
            stop,
            started_at,
            ..
        } = self;
        let quiet_from = Instant::now();
        let quiescence =
            checks::await_quiescence(&services, &duplicator, load, quiescence_timeout).await;
        let time_to_quiescence = quiet_from.elapsed();
        let fleet = Arc::try_unwrap(fleet)
            .map_err(|_| anyhow::anyhow!("the fault schedule still holds the fleet"))?;
        let process_exits = fleet.stop().await;
        // A harness part that does not stop is a finding of the run, not a hang of it (a
        // 4-shard run once sat here for minutes under a loaded machine, with nothing said).
        let mut unstopped = Vec::new();
        if tokio::time::timeout(STOP_WITHIN, duplicator.stop())
            .await
            .is_err()
        {
            unstopped.push(checks::violation(
                "harness_did_not_stop",
                format!(
                    "the duplicator was still running {} s after its stop",
                    STOP_WITHIN.as_secs()
                ),
            ));
        }
        stop.cancel();
        let network_figures = network.as_ref().map(|network| {
            let resets = network.commit_resets();
            NetworkFigures {
                mode: network.capabilities().to_string(),
                commit_resets: resets.len() as u64,
                commit_resets_committed: resets.iter().filter(|r| r.committed()).count() as u64,
            }
        });
        if let Some(network) = network {
            unstopped.extend(
                network
                    .faults()
                    .into_iter()
                    .filter(|fault| fault.failed())
                    .map(|fault| checks::violation("network_fault_failed", fault.to_string())),
            );
            if let Err(e) = network.cleanup().await {
                unstopped.push(checks::violation(
                    "network_not_cleaned_up",
                    format!("{e:#}"),
                ));
            }
        }

        let mut violations = checks::run_all(
            &services,
            &duplicator,
            load,
            &outside.quotes,
            started_at,
            quiescence,
        )
        .await?;
        violations.extend(unstopped);
        let (webhook_violations, webhooks) =
            checks::webhook_deliveries(&services.pool, &outside.webhooks).await?;
        violations.extend(webhook_violations);
        let recording = watch.finish().await;
        Ok(Ending {
            webhooks,
            network: network_figures,
            time_to_quiescence,
            process_exits,
            violations,
            counts: checks::counts(&services.pool).await?,
            dead_letters: checks::dead_letters_by_reason(&services.pool).await?,
            peak_queue_depth: recording.peak_queue_depth(),
            recording,
            messages_seen: duplicator.seen(),
            copies_published: duplicator.copies(),
            malformed_injected: duplicator.malformed().len() as u64,
        })
    }
}
