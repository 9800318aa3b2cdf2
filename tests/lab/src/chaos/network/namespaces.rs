//! The run's network namespaces: names, addresses, creation, and removal of everything a
//! prefix created (at the end, and at the start for runs that were killed before theirs).
//!
//! Address plan: a run takes one free `10.213.R.0/24`, claimed by adding `10.213.R.1/32` (the
//! relays' address) to the host's `lo` with the label `lo:<prefix>`: the kernel refuses a
//! second identical address, so two runs starting together never share a subnet, and the label
//! is how a later run recognises a killed run's address. Slot `i` (one
//! function process) gets the /30 `10.213.R.4(i+1)`: the host end of its veth pair is `.+1`,
//! the namespace end (`veth0`) `.+2`, whose default route is the host end. A namespace reaches
//! the relay address through its veth (the host delivers it locally, no forwarding), and the
//! relay knows a connection's slot from its source address. Nothing is routed beyond the host:
//! `ip_forward` is untouched, so traffic stays inside the run's namespaces and the host.

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    sync::atomic::{AtomicUsize, Ordering},
};

use anyhow::{Context, bail};

use super::command::{Line, is_gone, pid_alive};

/// Slots per run: the /24 holds 64 /30s and the first is the relays'.
pub(crate) const MAX_SLOTS: usize = 63;
/// Every name a run creates starts with this, then the pid and a letter per network of the
/// process (`pbc1234a`): short enough for a veth name (15 bytes: `pbc` + 7 digits + letter +
/// `h` + 2 digits).
const PREFIX: &str = "pbc";
/// The inside end of every slot's veth pair.
pub(crate) const INSIDE_VETH: &str = "veth0";

/// Networks made by this process so far (the letter of the prefix).
static NETWORKS_IN_PROCESS: AtomicUsize = AtomicUsize::new(0);

/// Names and addresses of one run's namespaces.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) prefix: String,
    subnet: u8,
    pub(crate) slots: usize,
}

impl Plan {
    /// The relays' address, on the host's loopback.
    pub(crate) fn relay_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, 1)
    }

    fn block(&self, slot: usize) -> u8 {
        // slot < MAX_SLOTS, so 4 * (slot + 1) + 2 <= 254.
        (4 * (slot + 1)) as u8
    }

    pub(crate) fn host_ip(&self, slot: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, self.block(slot) + 1)
    }

    pub(crate) fn inside_ip(&self, slot: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, self.block(slot) + 2)
    }

    /// The slot whose namespace has `ip` (a relay's client address).
    pub(crate) fn slot_of(&self, ip: Ipv4Addr) -> Option<usize> {
        let [a, b, c, d] = ip.octets();
        if (a, b, c) != (10, 213, self.subnet) || d % 4 != 2 || d < 6 {
            return None;
        }
        let slot = usize::from(d / 4) - 1;
        (slot < self.slots).then_some(slot)
    }

    pub(crate) fn namespace(&self, slot: usize) -> String {
        format!("{}-{slot}", self.prefix)
    }

    pub(crate) fn host_veth(&self, slot: usize) -> String {
        format!("{}h{slot}", self.prefix)
    }
}

/// The pid of the run that created `name` (`pbc<pid><letter>...`, also as `lo:pbc...`).
fn owner(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("lo:")
        .unwrap_or(name)
        .strip_prefix(PREFIX)?;
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let letter = rest[digits..].chars().next()?;
    if digits == 0 || !letter.is_ascii_lowercase() {
        return None;
    }
    rest[..digits].parse().ok()
}

/// Whether `name` is what a run that no longer lives left behind.
fn left_by_dead_run(name: &str) -> bool {
    owner(name).is_some_and(|pid| pid != std::process::id() && !pid_alive(pid))
}

/// `ip -j ...` parsed.
async fn ip_json(args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let text = Line::new("ip")
        .arg("-j")
        .args(args.iter().copied())
        .run()
        .await?;
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_str(&text).with_context(|| format!("while reading `ip -j {}`", args.join(" ")))
}

/// Names of the host's network namespaces.
async fn namespaces() -> anyhow::Result<Vec<String>> {
    let list = ip_json(&["netns", "list"]).await?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ns| ns.get("name")?.as_str().map(str::to_owned))
        .collect())
}

/// Names of the host's links.
async fn links() -> anyhow::Result<Vec<String>> {
    let list = ip_json(&["link", "show"]).await?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|link| link.get("ifname")?.as_str().map(str::to_owned))
        .collect())
}

/// (address, label) of every IPv4 address on the host's `lo`.
async fn loopback_addresses() -> anyhow::Result<Vec<(String, String)>> {
    let list = ip_json(&["-4", "addr", "show", "dev", "lo"]).await?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|link| link.get("addr_info")?.as_array())
        .flatten()
        .filter_map(|info| {
            Some((
                info.get("local")?.as_str()?.to_owned(),
                info.get("label")?.as_str()?.to_owned(),
            ))
        })
        .collect())
}

/// The third octet of every `10.213.x.y` address on the host: subnets taken by other runs.
async fn subnets_in_use() -> anyhow::Result<BTreeSet<u8>> {
    let list = ip_json(&["-4", "addr", "show"]).await?;
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|link| link.get("addr_info")?.as_array())
        .flatten()
        .filter_map(|info| info.get("local")?.as_str()?.parse::<Ipv4Addr>().ok())
        .filter(|ip| ip.octets()[..2] == [10, 213])
        .map(|ip| ip.octets()[2])
        .collect())
}

/// What a run of this harness left behind, everything named after a pid that is gone: its
/// namespaces (and the processes still in them: a SIGKILLed harness leaves its function
/// processes running), host-side veths and relay address. Returns what it removed.
pub(crate) async fn remove_leftovers() -> anyhow::Result<Vec<String>> {
    let mut removed = Vec::new();
    for namespace in namespaces().await? {
        if left_by_dead_run(&namespace) {
            kill_processes_in(&namespace).await?;
            remove(Line::new("ip").args(["netns", "del", &namespace])).await?;
            removed.push(format!("namespace {namespace}"));
        }
    }
    for link in links().await? {
        if left_by_dead_run(&link) {
            remove(Line::new("ip").args(["link", "del", &link])).await?;
            removed.push(format!("link {link}"));
        }
    }
    for (address, label) in loopback_addresses().await? {
        if left_by_dead_run(&label) {
            remove(Line::new("ip").args(["addr", "del", &format!("{address}/32"), "dev", "lo"]))
                .await?;
            removed.push(format!("address {address} ({label})"));
        }
    }
    Ok(removed)
}

/// Runs a removal; a thing already gone is not an error.
async fn remove(line: Line) -> anyhow::Result<()> {
    match line.run().await {
        Err(e) if !is_gone(&e) => Err(e),
        _ => Ok(()),
    }
}

/// SIGKILLs every process in `namespace`: only ever a namespace of this harness's naming, so
/// processes a run of it started.
async fn kill_processes_in(namespace: &str) -> anyhow::Result<()> {
    let pids = match Line::new("ip")
        .args(["netns", "pids", namespace])
        .run()
        .await
    {
        Ok(pids) => pids,
        Err(e) if is_gone(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    for pid in pids.split_whitespace() {
        remove(Line::new("kill").args(["-KILL", pid])).await?;
    }
    Ok(())
}

/// Creates `slots` namespaces with their veth pairs, addresses and routes, and the relay
/// address, under a fresh prefix and a free subnet; undoes what it made if a step fails.
pub(crate) async fn create(slots: usize) -> anyhow::Result<Plan> {
    if slots == 0 || slots > MAX_SLOTS {
        bail!("a run has 1 to {MAX_SLOTS} namespaces ({slots} asked)");
    }
    let index = NETWORKS_IN_PROCESS.fetch_add(1, Ordering::SeqCst);
    let letter = u8::try_from(index)
        .ok()
        .filter(|i| *i < 26)
        .map(|i| char::from(b'a' + i))
        .context("more than 26 networks in one process: their names would collide")?;
    let prefix = format!("{PREFIX}{}{letter}", std::process::id());

    let subnet = claim_subnet(&format!("lo:{prefix}")).await?;
    let plan = Plan {
        prefix,
        subnet,
        slots,
    };

    for slot in 0..slots {
        if let Err(e) = create_slot(&plan, slot).await {
            if let Err(undo) = destroy(&plan).await {
                tracing::warn!(error = %format!("{undo:#}"), "cannot undo a half-made network");
            }
            return Err(e);
        }
    }
    Ok(plan)
}

/// Takes a free `10.213.R.0/24` by adding its relay address `10.213.R.1/32` to the host's `lo`
/// under `label`. Adding an address `lo` already has fails ("File exists"), so two runs
/// starting together never get the same subnet: the loser tries the next one. Subnets with
/// any `10.213.R.x` address on the host (another run's veths) are skipped.
pub(super) async fn claim_subnet(label: &str) -> anyhow::Result<u8> {
    let used = subnets_in_use().await?;
    let start = (std::process::id() % 256) as usize;
    let candidates = (0..256)
        .map(|i| ((start + i) % 256) as u8)
        .filter(|s| !used.contains(s));
    for subnet in candidates {
        let claim = Line::new("ip").args([
            "addr",
            "add",
            &format!("{}/32", Ipv4Addr::new(10, 213, subnet, 1)),
            "dev",
            "lo",
            "label",
            label,
        ]);
        match claim.run().await {
            Ok(_) => return Ok(subnet),
            Err(e) if format!("{e:#}").contains("File exists") => continue,
            Err(e) => return Err(e),
        }
    }
    bail!("every 10.213.x.0/24 is taken: 256 runs at once, or leftovers of live runs")
}

async fn create_slot(plan: &Plan, slot: usize) -> anyhow::Result<()> {
    let namespace = plan.namespace(slot);
    let host = plan.host_veth(slot);
    let ip = |args: &[&str]| Line::new("ip").args(args.iter().copied());
    let inside = |args: &[&str]| {
        Line::new("ip")
            .args(["-n", namespace.as_str()])
            .args(args.iter().copied())
    };
    ip(&["netns", "add", &namespace]).run().await?;
    // The inside end is made in the namespace at once, so no name of it ever exists on the host.
    ip(&[
        "link",
        "add",
        &host,
        "type",
        "veth",
        "peer",
        "name",
        INSIDE_VETH,
        "netns",
        &namespace,
    ])
    .run()
    .await?;
    ip(&[
        "addr",
        "add",
        &format!("{}/30", plan.host_ip(slot)),
        "dev",
        &host,
    ])
    .run()
    .await?;
    ip(&["link", "set", &host, "up"]).run().await?;
    inside(&[
        "addr",
        "add",
        &format!("{}/30", plan.inside_ip(slot)),
        "dev",
        INSIDE_VETH,
    ])
    .run()
    .await?;
    inside(&["link", "set", INSIDE_VETH, "up"]).run().await?;
    inside(&["link", "set", "lo", "up"]).run().await?;
    inside(&[
        "route",
        "add",
        "default",
        "via",
        &plan.host_ip(slot).to_string(),
    ])
    .run()
    .await?;
    Ok(())
}

/// Removes everything `plan` created, the processes still in its namespaces first; what is
/// already gone is fine. The host ends are deleted explicitly: a deleted namespace is torn down
/// asynchronously by the kernel, so its veth would linger for a moment.
pub(crate) async fn destroy(plan: &Plan) -> anyhow::Result<()> {
    let mut errors = Vec::new();
    for slot in 0..plan.slots {
        let namespace = plan.namespace(slot);
        if let Err(e) = kill_processes_in(&namespace).await {
            errors.push(format!("{e:#}"));
        }
        for line in removals(plan, slot) {
            if let Err(e) = remove(line).await {
                errors.push(format!("{e:#}"));
            }
        }
    }
    if let Err(e) = remove(relay_address_removal(plan)).await {
        errors.push(format!("{e:#}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("cleanup of {}: {}", plan.prefix, errors.join("; "))
    }
}

/// [`destroy`] without a runtime (from `Drop`, when a run or test ended without cleaning up).
/// The processes in the namespaces are left to the fleet's `kill_on_drop`.
pub(crate) fn destroy_blocking(plan: &Plan) {
    let lines = (0..plan.slots)
        .flat_map(|slot| removals(plan, slot))
        .chain([relay_address_removal(plan)]);
    for line in lines {
        if let Err(e) = line.run_blocking()
            && !is_gone(&e)
        {
            tracing::warn!(error = %format!("{e:#}"), "network cleanup");
        }
    }
}

fn removals(plan: &Plan, slot: usize) -> [Line; 2] {
    [
        Line::new("ip").args(["link", "del", &plan.host_veth(slot)]),
        Line::new("ip").args(["netns", "del", &plan.namespace(slot)]),
    ]
}

fn relay_address_removal(plan: &Plan) -> Line {
    Line::new("ip").args([
        "addr",
        "del",
        &format!("{}/32", plan.relay_ip()),
        "dev",
        "lo",
    ])
}

/// What of `prefix` is still on the host (namespaces, links, relay address): empty after a
/// cleanup.
pub(crate) async fn remains_of(prefix: &str) -> anyhow::Result<Vec<String>> {
    let ours = |name: &str| name.strip_prefix("lo:").unwrap_or(name).starts_with(prefix);
    let mut remains: Vec<String> = namespaces()
        .await?
        .into_iter()
        .filter(|n| ours(n))
        .map(|n| format!("namespace {n}"))
        .collect();
    remains.extend(
        links()
            .await?
            .into_iter()
            .filter(|l| ours(l))
            .map(|l| format!("link {l}")),
    );
    remains.extend(
        loopback_addresses()
            .await?
            .into_iter()
            .filter(|(_, label)| ours(label))
            .map(|(address, label)| format!("address {address} ({label})")),
    );
    Ok(remains)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_runs_pid_and_nothing_else_is_taken_for_ours() {
        assert_eq!(owner("pbc1234a-3"), Some(1234));
        assert_eq!(owner("pbc1234bh12"), Some(1234));
        assert_eq!(owner("lo:pbc77z"), Some(77));
        assert_eq!(owner("pbcx-1"), None);
        assert_eq!(owner("pbc12-1"), None);
        assert_eq!(owner("eth0"), None);
        assert_eq!(owner("lo"), None);
    }

    #[test]
    fn every_slot_has_its_own_block_and_the_relay_knows_it_by_its_address() {
        let plan = Plan {
            // The longest prefix a pid (pid_max is at most 2^22) can give.
            prefix: "pbc4194304z".into(),
            subnet: 7,
            slots: MAX_SLOTS,
        };
        assert_eq!(plan.relay_ip(), Ipv4Addr::new(10, 213, 7, 1));
        assert_eq!(plan.host_ip(0), Ipv4Addr::new(10, 213, 7, 5));
        assert_eq!(plan.inside_ip(0), Ipv4Addr::new(10, 213, 7, 6));
        assert_eq!(plan.inside_ip(62), Ipv4Addr::new(10, 213, 7, 254));
        for slot in 0..MAX_SLOTS {
            assert_eq!(plan.slot_of(plan.inside_ip(slot)), Some(slot));
            assert_eq!(plan.slot_of(plan.host_ip(slot)), None);
        }
        assert_eq!(plan.slot_of(plan.relay_ip()), None);
        assert_eq!(plan.slot_of(Ipv4Addr::new(10, 213, 8, 6)), None);
        assert!(plan.host_veth(62).len() <= 15);
    }
}
