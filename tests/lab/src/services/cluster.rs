//! A RabbitMQ cluster of the test's own (three nodes on loopback, `infra/local/cluster.sh`),
//! for the failover tests and the chaos run: kill a node, and the clients must move to
//! another while the quorum queues carry on.

use std::path::{Path, PathBuf};

use url::Url;

use super::{run_local_script, unused_port_run};
use paybus_config::BrokerSettings;

/// Nodes in a private cluster: a majority (2) survives the loss of any one.
pub const CLUSTER_SIZE: usize = 3;

/// Three RabbitMQ nodes joined into one cluster, with names, ports and a state folder of their
/// own. Killed and removed on drop.
pub struct PrivateCluster {
    /// `amqp://...` of each node, node 1 first.
    pub urls: Vec<Url>,
    state_dir: PathBuf,
    vars: Vec<(String, String)>,
}

impl PrivateCluster {
    /// Starts the nodes and joins them (about 20-40 s on two cores). Blocks the calling
    /// thread: call it from `spawn_blocking`.
    pub fn start() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self::start_in(std::env::temp_dir().join(format!("paybus-cluster-{}", &id[..12])))
    }

    /// A cluster whose state (data, logs of every node) lives in `state_dir`; its node names
    /// are unique to this start.
    pub fn start_in(state_dir: PathBuf) -> Self {
        let id = uuid::Uuid::new_v4();
        let size = CLUSTER_SIZE as u16;
        // One run for every port: AMQP, then management, then distribution, per node.
        let amqp = unused_port_run(3 * size);
        let mgmt = amqp + size;
        let dist = mgmt + size;
        let simple = id.simple().to_string();
        let vars = vec![
            ("PAYBUS_CLUSTER_SIZE".to_owned(), size.to_string()),
            (
                "PAYBUS_CLUSTER_NAME".to_owned(),
                format!("paybus-c{}", &simple[..10]),
            ),
            ("PAYBUS_CLUSTER_AMQP_PORT".to_owned(), amqp.to_string()),
            ("PAYBUS_CLUSTER_MGMT_PORT".to_owned(), mgmt.to_string()),
            ("PAYBUS_CLUSTER_DIST_PORT".to_owned(), dist.to_string()),
            (
                "PAYBUS_CLUSTER_DIR".to_owned(),
                state_dir.display().to_string(),
            ),
            // Whoever uses the cluster declares its own topology.
            ("PAYBUS_CLUSTER_DEFINITIONS".to_owned(), "none".to_owned()),
        ];
        let urls = (0..size)
            .map(|i| {
                Url::parse(&format!("amqp://guest:guest@127.0.0.1:{}/%2f", amqp + i))
                    .expect("node URL")
            })
            .collect();
        let cluster = Self {
            urls,
            state_dir,
            vars,
        };
        run_local_script("cluster.sh", &["start"], &cluster.vars);
        cluster
    }

    /// `base` (prefetch and the rest) on this cluster's nodes, node `first` (1-based) tried
    /// first and the others after it in order.
    pub fn broker_settings(&self, base: &BrokerSettings, first: usize) -> BrokerSettings {
        let mut nodes = self.urls.clone();
        nodes.rotate_left((first - 1) % self.urls.len());
        let mut settings = base.clone();
        settings.url = nodes.remove(0);
        settings.failover_urls = nodes;
        settings
    }

    /// SIGKILL of node `n` (1-based): a crash.
    pub fn kill_node(&self, n: usize) {
        self.node_script("kill-node", n);
    }

    /// A clean stop of node `n`.
    pub fn stop_node(&self, n: usize) {
        self.node_script("stop-node", n);
    }

    /// Starts node `n` again; it rejoins the cluster by itself.
    pub fn start_node(&self, n: usize) {
        self.node_script("start-node", n);
    }

    fn node_script(&self, command: &str, n: usize) {
        run_local_script("cluster.sh", &[command, &n.to_string()], &self.vars);
    }

    /// The state folder (every node's data and logs).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Kills every node and keeps the state folder (its logs, for a report to point at).
    pub fn kill_keeping_state(self) {
        self.kill_all();
        std::mem::forget(self);
    }

    fn kill_all(&self) {
        let _ = std::process::Command::new(super::local_script("cluster.sh"))
            .args(["stop", "--kill"])
            .envs(self.vars.iter().cloned())
            .output();
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}
