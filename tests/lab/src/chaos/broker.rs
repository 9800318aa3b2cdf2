//! The run's own broker: one RabbitMQ node (the quick profile, for CI speed) or a cluster of
//! three (the full profile), where quorum queues are meant to live: a majority survives the
//! SIGKILL of any one node, which a single node does not reliably (it can stay leaderless).

use std::path::{Path, PathBuf};

use lapin::{options::QueueDeclareOptions, types::FieldTable};
use paybus_config::BrokerSettings;
use paybus_lab::services::{CLUSTER_SIZE, PrivateCluster, PrivateService};

pub(super) enum OwnBroker {
    Node(PrivateService),
    Cluster(PrivateCluster),
}

/// The cluster's folder in the run's state folder (the single node's is `rabbitmq/`).
fn cluster_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("rabbitmq-cluster")
}

impl OwnBroker {
    /// The node counts a run may ask for.
    pub(super) const NODE_COUNTS: [usize; 2] = [1, CLUSTER_SIZE];

    /// Starts `nodes` nodes (1, or a cluster of [`CLUSTER_SIZE`]) in `state_dir`. Blocks.
    pub(super) fn start(state_dir: &Path, nodes: usize) -> Self {
        if nodes == 1 {
            Self::Node(PrivateService::start_rabbitmq_in(state_dir.to_path_buf()))
        } else {
            Self::Cluster(PrivateCluster::start_in(cluster_dir(state_dir)))
        }
    }

    /// Kills, by their pid files, the cluster nodes a previous run in `state_dir` left running
    /// (a run killed before its end). Names and ports are overridden, so nothing can fall back
    /// to a node of another folder.
    pub(super) fn kill_leftover_cluster(state_dir: &Path) {
        let script = super::repository_dir().join("infra/local/cluster.sh");
        let _ = std::process::Command::new(script)
            .args(["stop", "--kill"])
            .env("PAYBUS_CLUSTER_DIR", cluster_dir(state_dir))
            .env("PAYBUS_CLUSTER_NAME", "paybus-chaos-leftover")
            .env("PAYBUS_CLUSTER_SIZE", CLUSTER_SIZE.to_string())
            .env("PAYBUS_CLUSTER_BASE_PORT", "1")
            .stdin(std::process::Stdio::null())
            .output();
    }

    pub(super) fn nodes(&self) -> usize {
        match self {
            Self::Node(_) => 1,
            Self::Cluster(cluster) => cluster.urls.len(),
        }
    }

    /// `base` on this broker's nodes, node `first` (1-based) tried first.
    pub(super) fn settings(&self, base: &BrokerSettings, first: usize) -> BrokerSettings {
        match self {
            Self::Node(node) => BrokerSettings {
                url: node.url.clone(),
                failover_urls: Vec::new(),
                ..base.clone()
            },
            Self::Cluster(cluster) => cluster.broker_settings(base, first),
        }
    }

    /// A clean restart of node `n` (1-based): stop, then start on the same ports and data.
    pub(super) fn restart_node(&self, n: usize) {
        match self {
            Self::Node(node) => node.restart(false),
            Self::Cluster(cluster) => {
                cluster.stop_node(n);
                cluster.start_node(n);
            }
        }
    }

    /// A crash of node `n` of the cluster: SIGKILL, then a start (it rejoins).
    pub(super) fn crash_node(&self, n: usize) {
        match self {
            // Never scheduled: a single node can stay leaderless after a SIGKILL.
            Self::Node(node) => node.restart(true),
            Self::Cluster(cluster) => {
                cluster.kill_node(n);
                cluster.start_node(n);
            }
        }
    }

    /// Kills the nodes and keeps their state folders (logs, for the report to point at).
    pub(super) fn kill_keeping_state(self) {
        match self {
            Self::Node(node) => node.kill_keeping_state(),
            Self::Cluster(cluster) => cluster.kill_keeping_state(),
        }
    }
}

/// Messages ready in `queue` (a passive declare).
pub(crate) async fn ready(channel: &lapin::Channel, queue: &str) -> Result<u32, lapin::Error> {
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(declared.message_count())
}
