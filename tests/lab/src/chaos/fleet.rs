//! The processes of a chaos run: every catalog function's real binary, the sweeper and the HTTP
//! API (`paybus serve`), each a separate OS process under a supervisor that starts it again at
//! once when it dies (a SIGKILL from the schedule, or a failed start while the database is
//! down). With the run's network, each function lives in a network namespace of its own.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use paybus_config::Settings;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{
    Dice,
    network::Network,
    outside::{API_PROCESS, QUOTE_API_KEY, QUOTE_TIMEOUT, WEBHOOK_TIMEOUT, World},
};

/// One process to run: its name, the binary and its arguments.
#[derive(Debug, Clone)]
pub(crate) struct Binary {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) args: Vec<String>,
}

impl Binary {
    /// The HTTP API, not a function: it talks to the clients and the database, while the
    /// network faults are between the functions and the database or broker.
    pub(crate) fn is_api(&self) -> bool {
        self.name == API_PROCESS
    }
}

/// `--bin-dir`, or the folder of this `paybus-lab` binary (where `cargo build --workspace
/// --bins` puts the function binaries too).
pub(crate) fn bin_dir(asked: Option<&Path>) -> anyhow::Result<PathBuf> {
    match asked {
        Some(dir) => Ok(dir.to_path_buf()),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("the directory of this paybus-lab binary")?
            .to_path_buf()),
    }
}

/// The binaries a run starts besides the API's `paybus`: every catalog function (the canary
/// aside: no load uses it) and the sweeper. Each is its package's `paybus-<name>`.
fn function_binaries() -> Vec<&'static str> {
    let mut names: Vec<&str> = paybus_catalog::FUNCTIONS
        .iter()
        .map(|f| f.name)
        .filter(|name| *name != "canary")
        .collect();
    names.push("sweeper");
    names
}

/// The packages whose binaries [`binaries`] finds: what a build for a run must build.
pub(crate) fn packages() -> Vec<String> {
    function_binaries()
        .into_iter()
        .map(|name| format!("paybus-{name}"))
        .chain(std::iter::once("paybus".to_owned()))
        .collect()
}

/// Every one of [`function_binaries`] and the API (`paybus serve`), found in `dir` unless
/// substituted.
pub(crate) fn binaries(
    dir: &Path,
    substitutes: &[(String, PathBuf)],
) -> anyhow::Result<Vec<Binary>> {
    let names = function_binaries();
    for (name, _) in substitutes {
        if !names.contains(&name.as_str()) {
            bail!(
                "--substitute {name}=...: no such function (one of {})",
                names.join(", ")
            );
        }
    }
    let mut binaries = Vec::with_capacity(names.len());
    let mut missing = Vec::new();
    for name in names {
        let path = substitutes
            .iter()
            .find(|(n, _)| n == name)
            .map_or_else(|| dir.join(name), |(_, p)| p.clone());
        if !path.is_file() {
            missing.push(path.display().to_string());
        }
        binaries.push(Binary {
            name: name.to_owned(),
            path,
            args: Vec::new(),
        });
    }
    let paybus = dir.join("paybus");
    if !paybus.is_file() {
        missing.push(paybus.display().to_string());
    }
    binaries.push(Binary {
        name: API_PROCESS.to_owned(),
        path: paybus,
        args: vec!["serve".to_owned()],
    });
    if !missing.is_empty() {
        bail!(
            "function binaries not found: {} (build them with `cargo build --workspace --bins`, \
             or point --bin-dir at them)",
            missing.join(", ")
        );
    }
    Ok(binaries)
}

/// The environment of every function process: the run's database and broker (every node, in
/// the harness's order; [`Fleet::start`] gives each process its own), and settings short
/// enough that a crashed attempt is reaped and a retry is due within the run.
pub(crate) fn environment(settings: &Settings, world: &World) -> HashMap<String, String> {
    let quote_timeout = QUOTE_TIMEOUT.as_millis().to_string();
    [
        ("PAYBUS_DATABASE_URL", settings.database.url.to_string()),
        ("PAYBUS_AMQP_URL", settings.broker.to_env_value()),
        ("PAYBUS_DB_MAX_CONNECTIONS", "24".to_owned()),
        ("PAYBUS_PREFETCH", "16".to_owned()),
        ("RUST_LOG", "warn".to_owned()),
        ("PAYBUS_QUOTE_URL", world.quotes.url()),
        ("PAYBUS_QUOTE_API_KEY", QUOTE_API_KEY.to_owned()),
        // deliver-webhook opens the partners' sealed webhook secrets with it.
        ("PAYBUS_SECRETS_KEY", paybus_testkit::SECRETS_KEY.to_owned()),
        ("PAYBUS_QUOTE_TIMEOUT_MS", quote_timeout),
        ("PAYBUS_QUOTE_CONNECT_TIMEOUT_MS", "500".to_owned()),
        // > 2 x the quote timeout + 10 s, as the setting requires.
        ("PAYBUS_MATCH_ZOMBIE_TIMEOUT_MS", "15000".to_owned()),
        ("PAYBUS_MATCH_POLL_INTERVAL_MS", "500".to_owned()),
        ("PAYBUS_BONUS_WORKER_INTERVAL_MS", "1000".to_owned()),
        ("PAYBUS_BONUS_PROCESSING_TIMEOUT_MS", "10000".to_owned()),
        (
            "PAYBUS_WEBHOOK_TIMEOUT_MS",
            WEBHOOK_TIMEOUT.as_millis().to_string(),
        ),
        ("PAYBUS_WEBHOOK_BREAKER_COOLDOWN_MS", "2000".to_owned()),
        ("PAYBUS_FIRST_CHARGE_BONUS_PERCENT", "10".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// How one process ended its life in the run.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRecord {
    pub name: String,
    /// Times the schedule SIGKILLed it.
    pub killed: u32,
    /// Times it was started (1 + restarts).
    pub starts: u32,
}

/// One process as the fleet runs it: what, with which settings, and where.
pub(crate) struct ProcessSpec {
    pub(crate) binary: Binary,
    pub(crate) env: HashMap<String, String>,
    /// The network slot (namespace) it lives in; none: the host's, as without the network.
    pub(crate) slot: Option<usize>,
}

struct Supervised {
    /// What runs: a replacement (a rolling deploy) takes effect at its next start.
    binary: std::sync::Mutex<Binary>,
    /// The pid of the live process (0 while it is restarting).
    pid: AtomicU64,
    killed: AtomicU32,
    starts: AtomicU32,
}

impl Supervised {
    fn name(&self) -> String {
        lock(&self.binary).name.clone()
    }
}

/// How long a replaced process may take to finish its in-flight work and start again.
const REPLACE_WITHIN: Duration = Duration::from_secs(60);

/// What a replacement took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replaced {
    /// From the SIGTERM until the old process had exited.
    pub(crate) stopped_in: Duration,
    /// From the SIGTERM until the new process had started and settled.
    pub(crate) up_in: Duration,
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) struct Fleet {
    processes: Vec<Arc<Supervised>>,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl Fleet {
    /// Starts every process (in its namespace when it has a slot of `network`).
    pub(crate) async fn start(
        specs: Vec<ProcessSpec>,
        network: Option<Arc<Network>>,
        log_dir: &Path,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        let mut processes = Vec::new();
        for spec in specs {
            let supervised = Arc::new(Supervised {
                binary: std::sync::Mutex::new(spec.binary.clone()),
                pid: AtomicU64::new(0),
                killed: AtomicU32::new(0),
                starts: AtomicU32::new(0),
            });
            let log = log_dir.join(format!("{}.log", spec.binary.name));
            let place = Place {
                network: network.clone(),
                slot: spec.slot,
            };
            tasks.spawn(supervise(
                supervised.clone(),
                spec.env,
                place,
                log,
                stop.clone(),
            ));
            processes.push(supervised);
        }
        Ok(Self {
            processes,
            stop,
            tasks,
        })
    }

    /// SIGKILLs one live process chosen by `dice`; its name.
    pub(crate) async fn kill_random(&self, dice: &mut Dice) -> Option<String> {
        let process = &self.processes[dice.below(self.processes.len())];
        Self::kill(process).await
    }

    /// Replaces the process named `name` by `binary`, as a rolling deploy does: a SIGTERM (its
    /// in-flight work finishes), then `binary` in its place. Waits until the new process has
    /// started and `settle` has passed without it exiting; how long the old one took to go.
    pub(crate) async fn replace(
        &self,
        name: &str,
        binary: Binary,
        settle: Duration,
    ) -> anyhow::Result<Replaced> {
        let Some(process) = self.processes.iter().find(|p| p.name() == name) else {
            bail!("no process named {name} in the fleet");
        };
        let starts = process.starts.load(Ordering::SeqCst);
        *lock(&process.binary) = binary;
        let asked = std::time::Instant::now();
        let pid = process.pid.load(Ordering::SeqCst);
        if pid != 0 {
            signal(pid, "TERM").await;
        }
        let mut stopped_in = None;
        let deadline = asked + REPLACE_WITHIN;
        loop {
            if stopped_in.is_none() && process.pid.load(Ordering::SeqCst) != pid {
                stopped_in = Some(asked.elapsed());
            }
            if process.starts.load(Ordering::SeqCst) > starts {
                break;
            }
            if std::time::Instant::now() >= deadline {
                bail!("{name} was not started again within {REPLACE_WITHIN:?} of its SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stopped_in = stopped_in.unwrap_or_else(|| asked.elapsed());
        let started_pid = process.pid.load(Ordering::SeqCst);
        tokio::time::sleep(settle).await;
        if process.pid.load(Ordering::SeqCst) != started_pid {
            bail!("{name} exited within {settle:?} of its start (its log says why)");
        }
        Ok(Replaced {
            stopped_in,
            up_in: asked.elapsed(),
        })
    }

    /// SIGKILLs the process named `name` if it is alive; its name.
    pub(crate) async fn kill_named(&self, name: &str) -> Option<String> {
        let process = self.processes.iter().find(|p| p.name() == name)?;
        Self::kill(process).await
    }

    async fn kill(process: &Supervised) -> Option<String> {
        let pid = process.pid.load(Ordering::SeqCst);
        if pid == 0 {
            return None;
        }
        signal(pid, "KILL").await;
        process.killed.fetch_add(1, Ordering::Relaxed);
        Some(process.name())
    }

    /// Every process's name and the pid of its live instance (none while it restarts).
    pub(crate) fn pids(&self) -> Vec<(String, Option<u32>)> {
        self.processes
            .iter()
            .map(|p| {
                let pid = p.pid.load(Ordering::SeqCst);
                (p.name(), u32::try_from(pid).ok().filter(|&pid| pid != 0))
            })
            .collect()
    }

    /// SIGTERM to every process (they finish in-flight messages and exit); waits for them.
    pub(crate) async fn stop(mut self) -> Vec<ProcessRecord> {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        self.processes
            .iter()
            .map(|p| ProcessRecord {
                name: p.name(),
                killed: p.killed.load(Ordering::Relaxed),
                starts: p.starts.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// The pid file of a process's live instance, beside its log.
fn pid_file(log: &Path) -> PathBuf {
    log.with_extension("pid")
}

/// SIGKILLs what a run killed before its end left running (its processes outlive it: a
/// SIGTERM to the harness does not reach them), by the pid files in `log_dir`, each only if
/// that pid still runs the binary the file names.
pub(crate) fn kill_leftovers(log_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "pid") {
            continue;
        }
        let Some((pid, binary)) = std::fs::read_to_string(&path).ok().and_then(|text| {
            let (pid, binary) = text.split_once('\n')?;
            Some((pid.trim().parse::<u32>().ok()?, binary.trim().to_owned()))
        }) else {
            continue;
        };
        let running = std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&binary));
        if running {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// `kill -<signal> <pid>`: only ever a pid this run started.
async fn signal(pid: u64, signal: &str) {
    let _ = tokio::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .await;
}

/// Where a process runs: in its slot's namespace of the run's network, or on the host.
struct Place {
    network: Option<Arc<Network>>,
    slot: Option<usize>,
}

impl Place {
    fn command(&self, binary: &Binary) -> anyhow::Result<tokio::process::Command> {
        let mut command = match (&self.network, self.slot) {
            (Some(network), Some(slot)) => network.command(slot, &binary.path)?,
            _ => tokio::process::Command::new(&binary.path),
        };
        command.args(&binary.args);
        Ok(command)
    }
}

async fn supervise(
    process: Arc<Supervised>,
    env: HashMap<String, String>,
    place: Place,
    log: PathBuf,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log);
        let Ok((stdout, stderr)) = log_file.and_then(|f| Ok((f.try_clone()?, f))) else {
            tracing::error!(log = %log.display(), "cannot open the process log");
            return;
        };
        let binary = lock(&process.binary).clone();
        let child = place.command(&binary).and_then(|mut command| {
            Ok(command
                .envs(&env)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .kill_on_drop(true)
                .spawn()?)
        });
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                tracing::error!(binary = %binary.path.display(), error = %e, "cannot start");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        // The pid before the count: a replacement waits on the count, then reads the pid.
        process
            .pid
            .store(child.id().map_or(0, u64::from), Ordering::SeqCst);
        process.starts.fetch_add(1, Ordering::SeqCst);
        if let Some(pid) = child.id() {
            let _ = std::fs::write(
                pid_file(&log),
                format!("{pid}\n{}\n", binary.path.display()),
            );
        }
        tokio::select! {
            _ = child.wait() => {
                process.pid.store(0, Ordering::SeqCst);
                // Started again at once; a process that cannot start (database down) waits a
                // little between tries.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            () = stop.cancelled() => {
                if let Some(pid) = child.id() {
                    signal(u64::from(pid), "TERM").await;
                }
                if tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err() {
                    let _ = child.kill().await;
                }
                process.pid.store(0, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    /// The owner of every binary target in the workspace, from `cargo metadata`.
    fn package_of_each_binary() -> BTreeMap<String, String> {
        let output = std::process::Command::new(env!("CARGO"))
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let mut owners = BTreeMap::new();
        for package in metadata["packages"].as_array().unwrap() {
            for target in package["targets"].as_array().unwrap() {
                if target["kind"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k == "bin")
                {
                    owners.insert(
                        target["name"].as_str().unwrap().to_owned(),
                        package["name"].as_str().unwrap().to_owned(),
                    );
                }
            }
        }
        owners
    }

    /// A build of `packages()` (the previous release's, for an upgrade) has every binary a run
    /// starts: a package left out is found at the run's start, minutes after the build.
    #[test]
    fn the_packages_a_run_builds_own_every_binary_it_starts() {
        let owners = package_of_each_binary();
        let packages = super::packages();
        for binary in super::function_binaries().into_iter().chain(["paybus"]) {
            let owner = owners
                .get(binary)
                .unwrap_or_else(|| panic!("no package has a binary {binary}: {owners:?}"));
            assert!(
                packages.contains(owner),
                "{binary} is {owner}'s, which {packages:?} lacks"
            );
        }
    }
}
