//! MariaDB servers and RabbitMQ nodes (or a cluster of three) of a run's own — own state folder,
//! ports and node name — started with the same `infra/local` scripts developers use, for fault
//! tests and chaos runs that stop, kill and restart a service without disturbing anything else.
//! Killed and removed on drop.
//!
//! They live in the lab, not in the test kit: the kit never reaches up into
//! `infra/`.

mod cluster;

use url::Url;

pub use cluster::{CLUSTER_SIZE, PrivateCluster};

/// A RabbitMQ node or MariaDB server of the test's own (own state folder, ports and name),
/// started with the same `infra/local` scripts, for fault tests that stop and restart a
/// service without disturbing every other test. Killed and removed on drop.
pub struct PrivateService {
    /// `amqp://...` or `mysql://...` of this instance.
    pub url: Url,
    service: &'static str,
    state_dir: std::path::PathBuf,
    vars: Vec<(String, String)>,
}

/// The first of `n` consecutive loopback ports nobody listens on right now, between 20,000
/// and 32,000: below the ephemeral range, where outgoing connections take their local ports
/// (a node restarted on such a port can find it taken by a client's socket), and above the
/// range `infra/local/lib.sh` gives RabbitMQ's CLI nodes (19,100-19,199). Once these were
/// ephemeral ports: a restarted node's distribution port was taken by a `rabbitmqctl` of
/// another test, whose default range (35,672-35,682) lies inside the ephemeral one.
pub(crate) fn unused_port_run(n: u16) -> u16 {
    let salt = uuid::Uuid::new_v4().as_u128() as u16;
    let mut candidate = 20_000 + salt % 12_000;
    loop {
        let free = (candidate..candidate + n)
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
        if free {
            return candidate;
        }
        candidate = 20_000 + (candidate - 20_000 + 97) % 12_000;
    }
}

/// Kept for readability at call sites: a private RabbitMQ node.
pub type PrivateBroker = PrivateService;

fn local_script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../infra/local")
        .join(name)
}

/// Runs `infra/local/<name> <args>` with `vars`; panics with its output if it fails.
fn run_local_script(name: &str, args: &[&str], vars: &[(String, String)]) {
    let output = std::process::Command::new(local_script(name))
        .args(args)
        .envs(vars.iter().cloned())
        .output()
        .expect("run an infra/local script");
    assert!(
        output.status.success(),
        "{name} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PrivateService {
    /// Starts a RabbitMQ node (about 6 s). Blocks the calling thread: call it from
    /// `spawn_blocking`.
    pub fn start() -> Self {
        Self::start_rabbitmq()
    }

    pub fn start_rabbitmq() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self::start_rabbitmq_in(std::env::temp_dir().join(format!("paybus-broker-{}", &id[..12])))
    }

    /// A RabbitMQ node whose state (data, logs) lives in `state_dir`; its node name is
    /// unique to this start, so nodes of several state folders never meet.
    pub fn start_rabbitmq_in(state_dir: std::path::PathBuf) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let amqp_port = unused_port_run(3);
        let vars = vec![
            ("PAYBUS_AMQP_PORT".to_owned(), amqp_port.to_string()),
            (
                "PAYBUS_RABBITMQ_MGMT_PORT".to_owned(),
                (amqp_port + 1).to_string(),
            ),
            (
                "PAYBUS_RABBITMQ_DIST_PORT".to_owned(),
                (amqp_port + 2).to_string(),
            ),
            (
                "PAYBUS_RABBITMQ_NODENAME".to_owned(),
                format!("paybus-{}@localhost", &id[..12]),
            ),
        ];
        Self::launch(
            "rabbitmq",
            state_dir,
            vars,
            &format!("amqp://guest:guest@127.0.0.1:{amqp_port}/%2f"),
        )
    }

    /// Starts a MariaDB server (a few seconds) with an empty `paybus` database.
    pub fn start_mariadb() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self::start_mariadb_in(std::env::temp_dir().join(format!("paybus-mariadb-{}", &id[..12])))
    }

    /// A MariaDB server whose state (data, socket, log) lives in `state_dir`.
    pub fn start_mariadb_in(state_dir: std::path::PathBuf) -> Self {
        let port = unused_port_run(1);
        let vars = vec![("PAYBUS_MARIADB_PORT".to_owned(), port.to_string())];
        Self::launch(
            "mariadb",
            state_dir,
            vars,
            &format!("mysql://root@127.0.0.1:{port}/paybus"),
        )
    }

    fn launch(
        service: &'static str,
        state_dir: std::path::PathBuf,
        mut vars: Vec<(String, String)>,
        url: &str,
    ) -> Self {
        vars.push((
            "PAYBUS_STATE_DIR".to_owned(),
            state_dir.display().to_string(),
        ));
        let node = Self {
            url: Url::parse(url).expect("service URL"),
            service,
            state_dir,
            vars,
        };
        node.script("start.sh", &[service]);
        node
    }

    fn script(&self, name: &str, args: &[&str]) {
        run_local_script(name, args, &self.vars);
    }

    /// Stops the service cleanly and waits until it is gone. (RabbitMQ 3.10 single-node
    /// quorum queues sometimes elect no leader after a SIGKILL, so the tests of our recovery
    /// use the clean path.)
    pub fn stop(&self) {
        self.script("stop.sh", &[self.service]);
    }

    pub fn start_again(&self) {
        self.script("start.sh", &[self.service]);
    }

    /// `infra/local/restart-<service>.sh`: a clean stop (or, with `crash`, a SIGKILL), then a
    /// start on the same ports and data.
    pub fn restart(&self, crash: bool) {
        let script = format!("restart-{}.sh", self.service);
        self.script(&script, if crash { &["--kill"] } else { &[] });
    }

    /// `rabbitmqctl ARGS` on this RabbitMQ node, in the scripts' environment (`infra/local/lib.sh`:
    /// its node name and the CLI's ports); panics with the output if it fails, else its output.
    pub fn rabbitmqctl(&self, args: &[&str]) -> String {
        let output = std::process::Command::new("bash")
            .arg("-c")
            .arg(r#". "$0" && paybus_rabbitmqctl "$@""#)
            .arg(local_script("lib.sh"))
            .args(args)
            .envs(self.vars.iter().cloned())
            .output()
            .expect("run rabbitmqctl");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "rabbitmqctl {args:?} failed:\n{said}"
        );
        said
    }

    /// The state folder (data and logs).
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// Kills the service and keeps its state folder (its logs, for a report to point at).
    pub fn kill_keeping_state(self) {
        let _ = std::process::Command::new(local_script("stop.sh"))
            .args(["--kill", self.service])
            .envs(self.vars.iter().cloned())
            .output();
        std::mem::forget(self);
    }
}

impl Drop for PrivateService {
    fn drop(&mut self) {
        let _ = std::process::Command::new(local_script("stop.sh"))
            .args(["--kill", self.service])
            .envs(self.vars.iter().cloned())
            .output();
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}
