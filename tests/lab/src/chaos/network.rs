//! Network faults for a chaos run (latency, loss, partitions, socket kills and a reset right
//! after COMMIT) between the function processes and the database or the broker, with the
//! kernel's tools where the machine allows and TCP relays where it does not; docs/chaos.md
//! ("Network faults") has the mechanisms, fault by fault.
//!
//! Every function process gets a *slot*: with namespaces, a network namespace of the run's own
//! joined to the host by a veth pair ([`namespaces`](self::namespaces)); it cannot reach the
//! host's loopback, so the harness relays each service and rewrites the processes' URLs to the
//! relays ([`Network::rewrite`]). Without namespaces ([`Network::start`] succeeds anyway) the
//! relays listen on 127.0.0.1, one per service and slot, and loss is not applied
//! ([`Capabilities`] says which ran). A reset after COMMIT is always the relay's: only a reader
//! of the MySQL stream knows when a COMMIT has gone out.
//!
//! Use: [`Network::start`], a [`Network::relay`] per service, [`Network::command`] per process,
//! the faults (each returns a record and ends by itself), then [`Network::cleanup`] (also on drop).

// The chaos schedule and fleet do not call it yet (the integration is its own change).
#![allow(dead_code)]

mod command;
mod mysql;
mod namespaces;
mod relay;
#[cfg(test)]
mod tests;

use std::{
    ffi::OsStr,
    fmt,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use self::{
    command::Line,
    namespaces::{INSIDE_VETH, Plan},
    relay::{Binding, Latency, Relays},
};
pub(crate) use self::{
    namespaces::MAX_SLOTS,
    relay::{CommitReset, Peer},
};

/// What a run asks of its network.
#[derive(Debug, Clone)]
pub(crate) struct NetworkOptions {
    /// Function processes, one namespace each (1 to [`MAX_SLOTS`]).
    pub(crate) slots: usize,
    /// Try namespaces (false: relays on 127.0.0.1 only, as where namespaces cannot be made).
    pub(crate) namespaces: bool,
}

/// Whether a mechanism works here, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "why", rename_all = "snake_case")]
pub(crate) enum Support {
    Yes,
    No(String),
}

impl Support {
    pub(crate) fn yes(&self) -> bool {
        *self == Self::Yes
    }
}

/// What the machine allowed this run: the probe's result, for the report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Capabilities {
    /// `ip netns add` and veth pairs (root / CAP_NET_ADMIN and iproute2).
    pub(crate) namespaces: Support,
    /// `tc qdisc add ... netem` in a namespace.
    pub(crate) netem: Support,
    /// `nft` present and able to add a table in a namespace.
    pub(crate) nft: Support,
    /// `ss -K` destroys a socket (`CONFIG_INET_DIAG_DESTROY`).
    pub(crate) ss_kill: Support,
    /// What earlier runs left behind and this one removed.
    pub(crate) leftovers_removed: Vec<String>,
}

impl fmt::Display for Capabilities {
    /// One line: `network faults: kernel (netns + nft + ss; latency by relay: no netem)`, or
    /// `network faults: relays only (no namespaces: ...) — ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Support::No(why) = &self.namespaces {
            return write!(
                f,
                "network faults: relays only (no namespaces: {why}) — latency, partitions, \
                 socket resets and COMMIT resets by relay; no packet loss"
            );
        }
        let mut tools = vec!["netns"];
        let mut notes = Vec::new();
        if self.netem.yes() {
            tools.push("netem");
        } else {
            notes.push("latency by relay: no netem");
        }
        if self.nft.yes() {
            tools.push("nft");
        } else {
            notes.push("no loss, partitions by relay: no nft");
        }
        if self.ss_kill.yes() {
            tools.push("ss");
        } else {
            notes.push("socket kills by relay: no ss -K");
        }
        write!(f, "network faults: kernel ({}", tools.join(" + "))?;
        if !notes.is_empty() {
            write!(f, "; {}", notes.join("; "))?;
        }
        f.write_str(")")
    }
}

/// Which mechanism carried a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Mechanism {
    Netem,
    Nft,
    SsKill,
    Relay,
    /// Nothing could (see [`Applied::NotAvailable`]).
    None,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Netem => "netem",
            Self::Nft => "nft",
            Self::SsKill => "ss -K",
            Self::Relay => "relay",
            Self::None => "none",
        })
    }
}

/// Whether a fault took effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "why", rename_all = "snake_case")]
pub(crate) enum Applied {
    Yes,
    /// This machine cannot make it (a documented gap, not a failure).
    NotAvailable(String),
    /// It should have worked and did not: the command and what it said.
    Failed(String),
}

/// One network fault, as the report lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NetFault {
    pub(crate) at: chrono::DateTime<chrono::Utc>,
    /// Seconds since the network started.
    pub(crate) at_s: f64,
    pub(crate) slot: usize,
    /// The slot's namespace (none without namespaces).
    pub(crate) namespace: Option<String>,
    pub(crate) what: String,
    pub(crate) mechanism: Mechanism,
    pub(crate) applied: Applied,
    /// How long applying it took.
    pub(crate) took_ms: u64,
    /// How long it holds (none: a one-off, or armed until used).
    pub(crate) lasts_ms: Option<u64>,
    /// Connections it cut, for a socket kill.
    pub(crate) cut: Option<u64>,
}

impl NetFault {
    pub(crate) fn failed(&self) -> bool {
        matches!(self.applied, Applied::Failed(_))
    }
}

impl fmt::Display for NetFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{namespace}: {}", self.what)?,
            None => write!(f, "slot {}: {}", self.slot, self.what)?,
        }
        match &self.applied {
            Applied::Yes => write!(f, " ({})", self.mechanism),
            Applied::NotAvailable(why) => write!(f, ": not applied ({why})"),
            Applied::Failed(why) => write!(f, " ({}) FAILED: {why}", self.mechanism),
        }
    }
}

/// A run's network: its namespaces (if any), its relays and the faults it applied.
pub(crate) struct Network {
    plan: Option<Plan>,
    capabilities: Capabilities,
    relays: Arc<Relays>,
    slots: usize,
    log: Arc<Mutex<Vec<NetFault>>>,
    next_id: AtomicU64,
    /// The latency fault whose netem qdiscs a slot carries (a later one replaces it).
    netem_owner: Arc<Mutex<Vec<Option<u64>>>>,
    /// The faults' own ends, waiting for their time.
    ends: TaskTracker,
    ends_stop: CancellationToken,
    started: Instant,
    cleaned: AtomicBool,
}

impl Network {
    /// Removes what killed runs left, then makes `options.slots` namespaces and probes what
    /// this machine allows; where namespaces cannot be made, falls back to relays on
    /// 127.0.0.1 (never an error: the reason is in [`capabilities`](Self::capabilities)).
    pub(crate) async fn start(options: NetworkOptions) -> anyhow::Result<Self> {
        let slots = options.slots;
        if slots == 0 || slots > MAX_SLOTS {
            bail!("a network has 1 to {MAX_SLOTS} slots ({slots} asked)");
        }
        let mut leftovers_removed = Vec::new();
        let plan = if options.namespaces {
            match namespaces::remove_leftovers().await {
                Ok(removed) => leftovers_removed = removed,
                // Not fatal: without the rights to remove them, namespaces cannot be made
                // either, and the reason shows there.
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot remove the leftovers of killed runs")
                }
            }
            namespaces::create(slots)
                .await
                .map_err(|e| format!("{e:#}"))
        } else {
            Err("not asked for".to_owned())
        };
        let (plan, capabilities) = match plan {
            Ok(plan) => {
                let capabilities = Capabilities {
                    namespaces: Support::Yes,
                    netem: probe_netem(&plan).await,
                    nft: probe_nft(&plan).await,
                    ss_kill: probe_ss_kill().await,
                    leftovers_removed,
                };
                (Some(plan), capabilities)
            }
            Err(why) => {
                let no = || Support::No("no namespaces".to_owned());
                let capabilities = Capabilities {
                    namespaces: Support::No(why),
                    netem: no(),
                    nft: no(),
                    ss_kill: no(),
                    leftovers_removed,
                };
                (None, capabilities)
            }
        };
        let binding = plan.clone().map_or(Binding::PerSlot, Binding::Shared);
        Ok(Self {
            plan,
            capabilities,
            relays: Arc::new(Relays::new(binding, slots)),
            slots,
            log: Arc::default(),
            next_id: AtomicU64::new(1),
            netem_owner: Arc::new(Mutex::new(vec![None; slots])),
            ends: TaskTracker::new(),
            ends_stop: CancellationToken::new(),
            started: Instant::now(),
            cleaned: AtomicBool::new(false),
        })
    }

    pub(crate) fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    pub(crate) fn slots(&self) -> usize {
        self.slots
    }

    /// Slot `slot`'s namespace (none without namespaces).
    pub(crate) fn namespace(&self, slot: usize) -> Option<String> {
        self.plan
            .as_ref()
            .filter(|plan| slot < plan.slots)
            .map(|plan| plan.namespace(slot))
    }

    /// The prefix of every name this run made (none without namespaces).
    pub(crate) fn prefix(&self) -> Option<&str> {
        self.plan.as_ref().map(|plan| plan.prefix.as_str())
    }

    /// A command that runs `program` in slot `slot`: `ip netns exec <namespace> <program>`
    /// (`ip` enters the namespace and *execs* the program, so the child's pid is the
    /// program's and a SIGKILL to it kills the function), or the program itself without
    /// namespaces. Add arguments and environment as usual.
    pub(crate) fn command(
        &self,
        slot: usize,
        program: impl AsRef<OsStr>,
    ) -> anyhow::Result<tokio::process::Command> {
        if slot >= self.slots {
            bail!("no slot {slot} (this network has {})", self.slots);
        }
        let Some(plan) = &self.plan else {
            return Ok(tokio::process::Command::new(program));
        };
        let ip = command::find("ip").context("`ip` not found (Debian package iproute2)")?;
        let mut command = tokio::process::Command::new(ip);
        command
            .args(["netns", "exec", &plan.namespace(slot)])
            .arg(program);
        Ok(command)
    }

    /// Relays `upstream` (a service on the host's loopback) for every slot; `peer` is what
    /// partitions and socket kills name. Returns the relay's address for processes of no
    /// particular slot.
    pub(crate) async fn relay(
        &self,
        name: &str,
        peer: Peer,
        upstream: SocketAddr,
    ) -> anyhow::Result<SocketAddr> {
        self.relays.add(name, peer, upstream).await
    }

    /// [`relay`](Self::relay) for the `host:port` of a URL (`mysql://root@127.0.0.1:3306/x`).
    pub(crate) async fn relay_url(
        &self,
        name: &str,
        peer: Peer,
        url: &url::Url,
    ) -> anyhow::Result<SocketAddr> {
        let upstream = url
            .socket_addrs(|| None)
            .with_context(|| format!("the address of the {name} URL"))?
            .into_iter()
            .next()
            .with_context(|| format!("the {name} URL names no address"))?;
        self.relay(name, peer, upstream).await
    }

    /// Where slot `slot` (`None`: any process, e.g. for a URL stored in the database) reaches
    /// `upstream`, if it is relayed.
    pub(crate) fn address(&self, slot: Option<usize>, upstream: SocketAddr) -> Option<SocketAddr> {
        self.relays.address(slot, upstream)
    }

    /// `text` (a URL, a comma-separated list of them, any setting) with every relayed
    /// service's `127.0.0.1:port` replaced by its relay's address for `slot` (`None`: any
    /// process). What is not relayed is left as it is.
    pub(crate) fn rewrite(&self, slot: Option<usize>, text: &str) -> String {
        self.relays.rewrite(slot, text)
    }

    /// Every fault applied so far (also those that failed or were not available).
    pub(crate) fn faults(&self) -> Vec<NetFault> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every COMMIT reset the relays injected, with the server's answer.
    pub(crate) fn commit_resets(&self) -> Vec<CommitReset> {
        self.relays.commit_resets()
    }

    /// Adds `base ± jitter` to each direction between slot `slot` and every peer (a round
    /// trip gains about twice `base`) for `lasts`: netem where the kernel has it, else the
    /// relays.
    pub(crate) async fn latency(
        &self,
        slot: usize,
        base: Duration,
        jitter: Duration,
        lasts: Duration,
    ) -> NetFault {
        let began = Instant::now();
        let what = format!("latency {base:?} ± {jitter:?} each way for {lasts:?}");
        if let Some(fault) = self.refuse_slot(slot, &what, began) {
            return fault;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let latency = Latency { base, jitter };
        let Some(plan) = self.plan.clone().filter(|_| self.capabilities.netem.yes()) else {
            self.relays.set_latency(slot, id, latency);
            let relays = self.relays.clone();
            self.end_after(lasts, &what, slot, Mechanism::Relay, async move {
                relays.clear_latency(slot, id);
                Ok(())
            });
            return self.record(
                slot,
                what,
                Mechanism::Relay,
                Applied::Yes,
                began,
                Some(lasts),
            );
        };
        if let Err(e) = netem(&plan, slot, Some(latency)).await {
            return self.record(slot, what, Mechanism::Netem, failed(&e), began, Some(lasts));
        }
        self.netem_owners()[slot] = Some(id);
        let owners = self.netem_owner.clone();
        self.end_after(lasts, &what, slot, Mechanism::Netem, async move {
            let current = {
                let mut owners = owners.lock().unwrap_or_else(|p| p.into_inner());
                let current = owners[slot] == Some(id);
                if current {
                    owners[slot] = None;
                }
                current
            };
            if current {
                netem(&plan, slot, None).await?;
            }
            Ok(())
        });
        self.record(
            slot,
            what,
            Mechanism::Netem,
            Applied::Yes,
            began,
            Some(lasts),
        )
    }

    /// Drops `percent` % of slot `slot`'s packets, each direction, for `lasts` (nft in its
    /// namespace). Not available without namespaces or nft: the record says so.
    pub(crate) async fn loss(&self, slot: usize, percent: u8, lasts: Duration) -> NetFault {
        let began = Instant::now();
        let what = format!("loss {percent} % each way for {lasts:?}");
        if let Some(fault) = self.refuse_slot(slot, &what, began) {
            return fault;
        }
        if percent > 100 {
            let applied = Applied::Failed(format!("{percent} % is not a percentage"));
            return self.record(slot, what, Mechanism::Nft, applied, began, Some(lasts));
        }
        let plan = match (&self.plan, &self.capabilities.nft) {
            (Some(plan), Support::Yes) => plan.clone(),
            (None, _) => {
                let why = "no namespaces: a relay cannot lose packets".to_owned();
                let applied = Applied::NotAvailable(why);
                return self.record(slot, what, Mechanism::None, applied, began, Some(lasts));
            }
            (Some(_), Support::No(why)) => {
                let applied = Applied::NotAvailable(format!("no nft: {why}"));
                return self.record(slot, what, Mechanism::None, applied, began, Some(lasts));
            }
        };
        let table = self.nft_table();
        let rules = format!(
            "table inet {table} {{\n\
             chain output {{ type filter hook output priority 0; policy accept; \
             oifname \"{INSIDE_VETH}\" numgen random mod 100 < {percent} counter drop; }}\n\
             chain input {{ type filter hook input priority 0; policy accept; \
             iifname \"{INSIDE_VETH}\" numgen random mod 100 < {percent} counter drop; }}\n}}\n"
        );
        self.nft_fault(plan, slot, what, table, rules, began, lasts)
            .await
    }

    /// Cuts slot `slot` off from `peer` (every relay to it) for `lasts`: nft drops in its
    /// namespace, both ways (connections stall and TCP recovers when it ends), or without
    /// namespaces or nft, the relays hold its connections (no byte passes, new connections
    /// get no answer) until it ends.
    pub(crate) async fn partition(&self, slot: usize, peer: Peer, lasts: Duration) -> NetFault {
        let began = Instant::now();
        let what = format!("partition from the {peer} for {lasts:?}");
        if let Some(fault) = self.refuse_slot(slot, &what, began) {
            return fault;
        }
        let ports = self.relays.ports(peer);
        if ports.is_empty() {
            let applied = Applied::Failed(format!("no relay to the {peer}"));
            return self.record(slot, what, Mechanism::None, applied, began, Some(lasts));
        }
        let Some(plan) = self.plan.clone().filter(|_| self.capabilities.nft.yes()) else {
            self.relays.blackhole(slot, peer, true);
            let relays = self.relays.clone();
            self.end_after(lasts, &what, slot, Mechanism::Relay, async move {
                relays.blackhole(slot, peer, false);
                Ok(())
            });
            return self.record(
                slot,
                what,
                Mechanism::Relay,
                Applied::Yes,
                began,
                Some(lasts),
            );
        };
        let table = self.nft_table();
        let ports = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let relay = plan.relay_ip();
        let rules = format!(
            "table inet {table} {{\n\
             chain output {{ type filter hook output priority 0; policy accept; \
             ip daddr {relay} tcp dport {{ {ports} }} counter drop; }}\n\
             chain input {{ type filter hook input priority 0; policy accept; \
             ip saddr {relay} tcp sport {{ {ports} }} counter drop; }}\n}}\n"
        );
        self.nft_fault(plan, slot, what, table, rules, began, lasts)
            .await
    }

    /// Arms the next `count` COMMITs of slot `slot` (on any of its database connections):
    /// each is forwarded to the server, the server's answer is kept from the client, and the
    /// client's connection is reset. Each injection is in [`commit_resets`](Self::commit_resets).
    pub(crate) async fn reset_after_commit(&self, slot: usize, count: u32) -> NetFault {
        let began = Instant::now();
        let what = format!("reset the connection right after the next {count} COMMIT(s)");
        if let Some(fault) = self.refuse_slot(slot, &what, began) {
            return fault;
        }
        if !self.relays.has(Peer::Database) {
            let applied = Applied::Failed("no relay to the database".to_owned());
            return self.record(slot, what, Mechanism::Relay, applied, began, None);
        }
        self.relays.arm_commit_resets(slot, count);
        self.record(slot, what, Mechanism::Relay, Applied::Yes, began, None)
    }

    /// COMMIT resets armed for slot `slot` and not yet injected.
    pub(crate) fn commit_resets_armed(&self, slot: usize) -> u32 {
        if slot >= self.slots {
            return 0;
        }
        self.relays.commit_resets_armed(slot)
    }

    /// Kills slot `slot`'s open connections to `peer`: `ss -K` in its namespace (the process
    /// gets ECONNABORTED), or the relays reset them.
    pub(crate) async fn kill_sockets(&self, slot: usize, peer: Peer) -> NetFault {
        let began = Instant::now();
        let what = format!("kill the sockets to the {peer}");
        if let Some(fault) = self.refuse_slot(slot, &what, began) {
            return fault;
        }
        let ports = self.relays.ports(peer);
        if ports.is_empty() {
            let applied = Applied::Failed(format!("no relay to the {peer}"));
            return self.record(slot, what, Mechanism::None, applied, began, None);
        }
        let Some(plan) = self
            .plan
            .clone()
            .filter(|_| self.capabilities.ss_kill.yes())
        else {
            let reset = self.relays.kill(slot, peer);
            let what = format!("{what}: {reset} connection(s) reset");
            let mut fault = self.record(slot, what, Mechanism::Relay, Applied::Yes, began, None);
            fault.cut = Some(reset as u64);
            return fault;
        };
        let mut killed = 0;
        for port in ports {
            let line = Line::inside(&plan.namespace(slot), "ss").args([
                "-K".to_owned(),
                "-t".to_owned(),
                "-n".to_owned(),
                "dst".to_owned(),
                format!("{}:{port}", plan.relay_ip()),
            ]);
            match line.run().await {
                // It lists what it destroyed, under a header.
                Ok(listed) => {
                    killed += listed
                        .lines()
                        .filter(|l| !l.trim().is_empty() && !l.starts_with("State"))
                        .count();
                }
                Err(e) => {
                    return self.record(slot, what, Mechanism::SsKill, failed(&e), began, None);
                }
            }
        }
        let what = format!("{what}: {killed} socket(s) killed");
        let mut fault = self.record(slot, what, Mechanism::SsKill, Applied::Yes, began, None);
        fault.cut = Some(killed as u64);
        fault
    }

    /// Ends every fault, stops the relays, removes the namespaces (and kills what still runs
    /// in them), their veths and the relay address. Stop the processes first. Idempotent.
    pub(crate) async fn cleanup(&self) -> anyhow::Result<()> {
        if self.cleaned.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.ends_stop.cancel();
        self.ends.close();
        self.ends.wait().await;
        self.relays.stop().await;
        if let Some(plan) = &self.plan {
            namespaces::destroy(plan).await?;
        }
        Ok(())
    }

    /// What of this run's names is still on the host (empty after [`cleanup`](Self::cleanup)).
    pub(crate) async fn remains(&self) -> anyhow::Result<Vec<String>> {
        match &self.plan {
            Some(plan) => namespaces::remains_of(&plan.prefix).await,
            None => Ok(Vec::new()),
        }
    }

    fn netem_owners(&self) -> std::sync::MutexGuard<'_, Vec<Option<u64>>> {
        self.netem_owner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh nft table name (one table per fault: its end deletes the table).
    fn nft_table(&self) -> String {
        format!("pbf{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    #[allow(clippy::too_many_arguments)]
    async fn nft_fault(
        &self,
        plan: Plan,
        slot: usize,
        what: String,
        table: String,
        rules: String,
        began: Instant,
        lasts: Duration,
    ) -> NetFault {
        let namespace = plan.namespace(slot);
        if let Err(e) = Line::inside(&namespace, "nft")
            .args(["-f", "-"])
            .stdin(rules)
            .run()
            .await
        {
            return self.record(slot, what, Mechanism::Nft, failed(&e), began, Some(lasts));
        }
        self.end_after(lasts, &what, slot, Mechanism::Nft, async move {
            Line::inside(&namespace, "nft")
                .args(["delete", "table", "inet", &table])
                .run()
                .await
                .map(drop)
        });
        self.record(slot, what, Mechanism::Nft, Applied::Yes, began, Some(lasts))
    }

    /// Runs `end` after `lasts` (unless the network is cleaned up first); a failed end is
    /// logged as a fault of its own.
    fn end_after(
        &self,
        lasts: Duration,
        what: &str,
        slot: usize,
        mechanism: Mechanism,
        end: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let stop = self.ends_stop.clone();
        let log = self.log.clone();
        let namespace = self.namespace(slot);
        let started = self.started;
        let what = format!("end of {what}");
        self.ends.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(lasts) => {
                    let began = Instant::now();
                    if let Err(e) = end.await {
                        tracing::warn!(fault = %what, error = %format!("{e:#}"), "a network fault did not end");
                        log.lock().unwrap_or_else(|p| p.into_inner()).push(NetFault {
                            at: chrono::Utc::now(),
                            at_s: began.duration_since(started).as_secs_f64(),
                            slot,
                            namespace,
                            what,
                            mechanism,
                            applied: failed(&e),
                            took_ms: began.elapsed().as_millis() as u64,
                            lasts_ms: None,
                            cut: None,
                        });
                    }
                }
            }
        });
    }

    /// The failed record of a fault on a slot that does not exist; none for a slot that does.
    fn refuse_slot(&self, slot: usize, what: &str, began: Instant) -> Option<NetFault> {
        if slot < self.slots {
            return None;
        }
        let applied = Applied::Failed(format!("no slot {slot} (this network has {})", self.slots));
        Some(self.record(slot, what.to_owned(), Mechanism::None, applied, began, None))
    }

    fn record(
        &self,
        slot: usize,
        what: String,
        mechanism: Mechanism,
        applied: Applied,
        began: Instant,
        lasts: Option<Duration>,
    ) -> NetFault {
        let fault = NetFault {
            at: chrono::Utc::now(),
            at_s: began.duration_since(self.started).as_secs_f64(),
            slot,
            namespace: self.namespace(slot),
            what,
            mechanism,
            applied,
            took_ms: began.elapsed().as_millis() as u64,
            lasts_ms: lasts.map(|d| d.as_millis() as u64),
            cut: None,
        };
        tracing::info!(fault = %fault, "network fault");
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fault.clone());
        fault
    }
}

impl Drop for Network {
    /// A run or test that ended without [`cleanup`](Network::cleanup) (a panic, an early
    /// return) still removes its namespaces: a machine shared by several runs must not
    /// collect them.
    fn drop(&mut self) {
        if self.cleaned.swap(true, Ordering::SeqCst) {
            return;
        }
        self.ends_stop.cancel();
        if let Some(plan) = &self.plan {
            namespaces::destroy_blocking(plan);
        }
    }
}

fn failed(error: &anyhow::Error) -> Applied {
    Applied::Failed(format!("{error:#}"))
}

/// Puts (`Some`) or takes off (`None`) a netem delay on both ends of slot `slot`'s veth: the
/// inside end delays what the process sends, the host end what it receives.
async fn netem(plan: &Plan, slot: usize, latency: Option<Latency>) -> anyhow::Result<()> {
    let namespace = plan.namespace(slot);
    let host = plan.host_veth(slot);
    let verb = if latency.is_some() { "replace" } else { "del" };
    let ends = [
        Line::inside(&namespace, "tc").args(["qdisc", verb, "dev", INSIDE_VETH, "root"]),
        Line::new("tc").args(["qdisc", verb, "dev", host.as_str(), "root"]),
    ];
    for end in ends {
        let line = match latency {
            Some(Latency { base, jitter }) => end.args([
                "netem".to_owned(),
                "delay".to_owned(),
                format!("{}us", base.as_micros()),
                format!("{}us", jitter.as_micros()),
            ]),
            None => end,
        };
        line.run().await?;
    }
    Ok(())
}

/// Whether `tc ... netem` works in the first namespace (put on and taken off again).
async fn probe_netem(plan: &Plan) -> Support {
    let namespace = plan.namespace(0);
    let add = Line::inside(&namespace, "tc").args([
        "qdisc",
        "add",
        "dev",
        INSIDE_VETH,
        "root",
        "netem",
        "delay",
        "1ms",
    ]);
    match add.run().await {
        Ok(_) => {
            let del =
                Line::inside(&namespace, "tc").args(["qdisc", "del", "dev", INSIDE_VETH, "root"]);
            match del.run().await {
                Ok(_) => Support::Yes,
                Err(e) => Support::No(format!("{e:#}")),
            }
        }
        Err(e) => Support::No(format!("{e:#}")),
    }
}

/// Whether `nft` can add (and delete) a table in the first namespace.
async fn probe_nft(plan: &Plan) -> Support {
    let namespace = plan.namespace(0);
    let add = Line::inside(&namespace, "nft").args(["add", "table", "inet", "pbprobe"]);
    let del = Line::inside(&namespace, "nft").args(["delete", "table", "inet", "pbprobe"]);
    match add.run().await {
        Ok(_) => match del.run().await {
            Ok(_) => Support::Yes,
            Err(e) => Support::No(format!("{e:#}")),
        },
        Err(e) => Support::No(format!("{e:#}")),
    }
}

/// Whether `ss -K` destroys a socket: one loopback connection of the harness's own, killed
/// by its ports (nothing else matches), must then read an error.
async fn probe_ss_kill() -> Support {
    match ss_kill_works().await {
        Ok(()) => Support::Yes,
        Err(e) => Support::No(format!("{e:#}")),
    }
}

async fn ss_kill_works() -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let server = listener.local_addr()?;
    let mut client = tokio::net::TcpStream::connect(server).await?;
    let (_accepted, _) = listener.accept().await?;
    let local = client.local_addr()?;
    Line::new("ss")
        .args(["-K", "-t", "-n", "src"])
        .arg(local.to_string())
        .arg("dst")
        .arg(server.to_string())
        .run()
        .await?;
    match tokio::time::timeout(Duration::from_secs(2), client.read(&mut [0_u8; 1])).await {
        Ok(Err(_)) => Ok(()),
        Ok(Ok(_)) => bail!("`ss -K` ran but the socket read on (end of stream or data)"),
        Err(_) => bail!("`ss -K` ran but the socket survived (a kernel without INET_DIAG_DESTROY)"),
    }
}
