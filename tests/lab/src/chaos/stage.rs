//! The stage a run plays on, shared by chaos and the soak (`bench soak`): on the run's own
//! services, a fresh database with the migrations and the topology, the quote service stub
//! and the partner webhook endpoint, the HTTP API, the duplicator, the queue-depth watch and
//! every function as its own process. [`Stage::finish`] is the common ending: quiescence,
//! every process stopped, then the exactly-once checks.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use paybus_platform::{bus::Services, db};
use tokio_util::sync::CancellationToken;

use super::{
    OwnServices, Profile,
    checks::{self, DeadLetters, Violation},
    duplicator::Duplicator,
    fleet::{self, Fleet, ProcessRecord},
    load::Load,
    outside::{self, Api, World},
    report::DepthWatch,
};

/// How long the harness's own parts (the duplicator, the API) may take to stop.
const STOP_WITHIN: Duration = Duration::from_secs(30);

pub(crate) struct Stage {
    pub(crate) services: Services,
    pub(crate) outside: World,
    pub(crate) api: Api,
    pub(crate) duplicator: Duplicator,
    pub(crate) depth: DepthWatch,
    pub(crate) fleet: Arc<Fleet>,
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
    /// Events the tap saw, copies it published, malformed messages it injected.
    pub(crate) messages_seen: u64,
    pub(crate) copies_published: u64,
    pub(crate) malformed_injected: u64,
}

impl Stage {
    pub(crate) async fn start(
        profile: &Profile,
        own: &OwnServices,
        binaries: &[fleet::Binary],
        state_dir: &Path,
    ) -> anyhow::Result<Self> {
        let settings = own.settings()?;
        let services = Services::connect(settings.clone())
            .await
            .context("while connecting to the run's own database and broker")?;
        db::migrate(&services.pool).await?;
        services.declare_topology(&paybus_catalog::queues()).await?;

        let outside = World::start(profile).await;
        let api = outside::start_api(&services, &outside).await?;
        let stop = CancellationToken::new();
        let duplicator = Duplicator::start(&services, profile, stop.clone()).await?;
        let depth = DepthWatch::start(services.link.clone(), stop.clone());

        let mut env = fleet::environment(&settings, &outside);
        // Always set (empty: none sharded), so no value inherited from this shell applies.
        env.insert(
            paybus_platform::bus::topology::Shards::VARIABLE.to_owned(),
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
        let fleet =
            Arc::new(Fleet::start(binaries, env, &node_orders, &state_dir.join("logs")).await?);
        Ok(Self {
            services,
            outside,
            api,
            duplicator,
            depth,
            fleet,
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
            api,
            duplicator,
            depth,
            fleet,
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
        if tokio::time::timeout(STOP_WITHIN, api.stop()).await.is_err() {
            unstopped.push(checks::violation(
                "harness_did_not_stop",
                format!(
                    "the API still had requests in flight {} s after its stop",
                    STOP_WITHIN.as_secs()
                ),
            ));
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
        Ok(Ending {
            time_to_quiescence,
            process_exits,
            violations,
            counts: checks::counts(&services.pool).await?,
            dead_letters: checks::dead_letters_by_reason(&services.pool).await?,
            peak_queue_depth: depth.peak(),
            messages_seen: duplicator.seen(),
            copies_published: duplicator.copies(),
            malformed_injected: duplicator.malformed().len() as u64,
        })
    }
}
