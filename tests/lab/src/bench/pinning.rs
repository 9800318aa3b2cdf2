//! `--pin-broker`: the production topology on one machine. Amazon MQ runs RabbitMQ on hosts
//! of its own, so its per-message CPU never competes with the functions' and the database's;
//! on these 2 cores it does, and that is most of W2's gap between through-the-broker and
//! direct. Pinned, RabbitMQ gets CPU 0 alone, and MariaDB and this bench share the others —
//! what a deployment's separate hosts give, as near as one machine can. The kernel's own tool
//! does it (`taskset`, util-linux), every thread of each process;
//! dropping the [`Pinned`] guard gives every process every CPU again.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, bail};

/// The affinities set, undone on drop.
pub(crate) struct Pinned {
    pids: Vec<u32>,
    all: String,
}

pub(crate) fn state_dir() -> PathBuf {
    std::env::var_os("PAYBUS_STATE_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.local"),
        PathBuf::from,
    )
}

pub(crate) fn pid_in(file: PathBuf) -> anyhow::Result<u32> {
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading {} (is the local service running?)", file.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("{} holds no pid", file.display()))
}

fn taskset(cpus: &str, pid: u32) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["--all-tasks", "--cpu-list", "--pid", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("running taskset (util-linux)")?;
    if !status.success() {
        bail!("taskset {cpus} {pid} failed: {status}");
    }
    Ok(())
}

/// RabbitMQ (the local one, `infra/local`) on CPU 0; MariaDB and this process on CPUs 1..n.
pub(crate) fn pin_broker() -> anyhow::Result<Pinned> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 {
        bail!("--pin-broker needs at least 2 CPUs (this machine has {cpus})");
    }
    let dir = state_dir();
    let rabbitmq = pid_in(dir.join("rabbitmq/pid"))?;
    let mariadb = pid_in(dir.join("mariadb/pid"))?;
    let rest = format!("1-{}", cpus - 1);
    let pinned = Pinned {
        pids: vec![rabbitmq, mariadb, std::process::id()],
        all: format!("0-{}", cpus - 1),
    };
    taskset("0", rabbitmq)?;
    taskset(&rest, mariadb)?;
    taskset(&rest, std::process::id())?;
    println!(
        "pinned: RabbitMQ (pid {rabbitmq}) on CPU 0; MariaDB (pid {mariadb}) and the bench on \
         CPUs {rest}"
    );
    Ok(pinned)
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for pid in &self.pids {
            if let Err(error) = taskset(&self.all, *pid) {
                eprintln!("could not give pid {pid} every CPU again: {error:#}");
            }
        }
    }
}
