//! The chaos run's report: a table for people, the same as JSON (`--json`) for machines.

use std::{collections::BTreeMap, fmt, path::PathBuf, time::Duration};

use serde::Serialize;

use crate::finished::Workflow;

use super::{
    Profile,
    checks::{DeadLetters, Violation, WebhookFigures},
    deploy::DeployFigures,
    faults::Fault,
    fleet::ProcessRecord,
    load::{Load, Sent},
};

/// The run's network in figures.
#[derive(Debug, Clone, Serialize)]
pub struct NetworkFigures {
    /// What the machine allowed ("network faults: kernel (netns + nft + ss; …)").
    pub mode: String,
    /// Connections reset right after their COMMIT went out, and how many of those COMMITs
    /// the server carried out (the client could not know).
    pub commit_resets: u64,
    pub commit_resets_committed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// From the first request to the last answer.
    #[serde(serialize_with = "seconds")]
    pub load_sent: Duration,
    /// From the end of the faults until nothing moved.
    #[serde(serialize_with = "seconds")]
    pub time_to_quiescence: Duration,
    #[serde(serialize_with = "seconds")]
    pub total: Duration,
    /// The most messages ready in the functions' queues at once (the timeline's samples,
    /// every second).
    pub peak_queue_depth: u64,
    /// Broker nodes SIGKILLed (and started again) during the run.
    pub broker_node_kills: u64,
    /// Events the tap saw, copies it published, malformed messages it injected.
    pub messages_seen: u64,
    pub copies_published: u64,
    pub malformed_injected: u64,
    pub quote_calls: u64,
    pub trade_calls: u64,
    /// createTrade calls the quote service answered with a trade after the client's timeout
    /// (an *unknown* outcome that was in fact done): the run tested principle 12 only if > 0.
    pub late_trades: u64,
    pub webhook_posts: u64,
    pub webhook_refused: u64,
    /// What the partners' endpoint received: at-least-once's repeats, the late answers.
    pub webhooks: WebhookFigures,
    /// The run's network: which mechanisms ran, the resets after COMMIT ("off" without it).
    pub network: Option<NetworkFigures>,
    /// SIGKILLs of the HTTP API process.
    pub api_kills: u64,
}

pub(crate) fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 10.0).round() / 10.0)
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The fault schedule's seed, first (`--seed` repeats its choices): a failed run is
    /// reproduced from it.
    pub seed: u64,
    pub profile: Profile,
    pub figures: Figures,
    pub load: Load,
    pub faults: Vec<Fault>,
    pub process_exits: Vec<ProcessRecord>,
    /// Rows by state per workflow table, after the run.
    pub counts: BTreeMap<String, BTreeMap<String, i64>>,
    pub dead_letters: Vec<DeadLetters>,
    pub violations: Vec<Violation>,
    /// The run's MariaDB, RabbitMQ and process logs.
    pub state_dir: PathBuf,
    /// The run's picture (SVG: throughput, queue depth and fills in doubt over time, the
    /// faults as bands); None when it could not be drawn, with why.
    pub timeline: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline_not_drawn: Option<String>,
    /// An upgrade run's deploy (its steps are the fault log); none for a chaos run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deploy: Option<DeployFigures>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn sent_line(f: &mut fmt::Formatter<'_>, name: &str, sent: &Sent) -> fmt::Result {
    let answers: Vec<String> = sent
        .answers
        .iter()
        .map(|(status, n)| format!("{status}: {n}"))
        .collect();
    writeln!(
        f,
        "  {name:<26} {:>6} items {:>7} requests  ({})",
        sent.items,
        sent.requests,
        answers.join(", ")
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.profile;
        let fig = &self.figures;
        writeln!(
            f,
            "seed {} (--seed {} makes the same fault choices)",
            self.seed, self.seed
        )?;
        writeln!(
            f,
            "paybus-lab {}: {} profile, {} items, every message x{}, 1 in {} malformed, {}{}",
            if self.deploy.is_some() {
                "upgrade"
            } else {
                "chaos"
            },
            p.name,
            p.items,
            p.copies,
            p.malformed_every,
            if p.broker_nodes == 1 {
                "one RabbitMQ node".to_owned()
            } else {
                format!("a RabbitMQ cluster of {} nodes", p.broker_nodes)
            },
            if p.shards > 1 {
                format!(", every function on {} shards", p.shards)
            } else {
                String::new()
            }
        )?;
        writeln!(f, "\nload (through the HTTP API)")?;
        sent_line(f, "p2p: deposit orders", &self.load.p2p_deposit_orders)?;
        sent_line(
            f,
            "confirmations: chain-monitor confirmations",
            &self.load.confirmations,
        )?;
        sent_line(
            f,
            "bonuses: payment completions",
            &self.load.payment_completions,
        )?;
        sent_line(f, "markets: market orders", &self.load.market_orders)?;
        writeln!(
            f,
            "  markets: markets suspended mid-load: {}",
            self.load.markets
        )?;
        match &self.deploy {
            Some(deploy) => deploy_lines(f, deploy, &self.faults)?,
            None => self.fault_lines(f)?,
        }
        let processes: Vec<String> = self
            .process_exits
            .iter()
            .map(|p| format!("{} {}k/{}s", p.name, p.killed, p.starts))
            .collect();
        writeln!(f, "  processes (killed/started): {}", processes.join(", "))?;
        writeln!(f, "\nfigures")?;
        writeln!(f, "  load sent in             {:>8.1?}", fig.load_sent)?;
        writeln!(
            f,
            "  time to quiescence       {:>8.1?}",
            fig.time_to_quiescence
        )?;
        writeln!(f, "  whole run                {:>8.1?}", fig.total)?;
        writeln!(f, "  peak queue depth         {:>8}", fig.peak_queue_depth)?;
        writeln!(
            f,
            "  messages seen / copies / malformed  {} / {} / {}",
            fig.messages_seen, fig.copies_published, fig.malformed_injected
        )?;
        writeln!(
            f,
            "  quote calls / trade calls {} / {} ({} traded, answered after the client's timeout);  webhook POSTs {} ({} refused)",
            fig.quote_calls,
            fig.trade_calls,
            fig.late_trades,
            fig.webhook_posts,
            fig.webhook_refused
        )?;
        writeln!(
            f,
            "  webhooks: {} notifications received, {} accepted again (at least once), {} accepted after the sender's timeout",
            fig.webhooks.notifications, fig.webhooks.accepted_again, fig.webhooks.answered_late
        )?;
        writeln!(f, "\nitems by state")?;
        for (table, states) in &self.counts {
            let states: Vec<String> = states.iter().map(|(s, n)| format!("{s} {n}")).collect();
            writeln!(f, "  {table:<20} {}", states.join(", "))?;
        }
        writeln!(f, "\ndead letters by reason")?;
        if self.dead_letters.is_empty() {
            writeln!(f, "  none")?;
        }
        for group in &self.dead_letters {
            writeln!(
                f,
                "  {:<20} {:<16} {:>6}",
                group.function, group.reason, group.count
            )?;
        }
        writeln!(f, "\nlogs: {}", self.state_dir.display())?;
        match (&self.timeline, &self.timeline_not_drawn) {
            (Some(path), _) => writeln!(f, "timeline: {}", path.display())?,
            (None, Some(why)) => writeln!(f, "timeline: not drawn ({why})")?,
            (None, None) => {}
        }
        if self.violations.is_empty() {
            writeln!(
                f,
                "\nPASSED: every item terminal, audit clean, every malformed message dead-lettered, no other dead letter unexplained, every queue empty, every webhook delivered or FAILED"
            )
        } else {
            writeln!(f, "\nFAILED: {} violation(s)", self.violations.len())?;
            for v in &self.violations {
                writeln!(f, "  [{}] {}", v.check, v.detail)?;
            }
            Ok(())
        }
    }
}

impl Report {
    /// The chaos schedule's faults.
    fn fault_lines(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fig = &self.figures;
        let kills = self
            .faults
            .iter()
            .filter(|x| x.what.starts_with("SIGKILL"))
            .count();
        writeln!(
            f,
            "\nfaults: {kills} SIGKILLs of function processes, {} SIGKILLs of a broker node, and",
            fig.broker_node_kills
        )?;
        for fault in self
            .faults
            .iter()
            .filter(|x| !x.what.starts_with("SIGKILL") && !x.what.starts_with("quote"))
        {
            writeln!(
                f,
                "  {:>7.1}s  {} ({} ms)",
                fault.at_s, fault.what, fault.took_ms
            )?;
        }
        let quote_phases = self
            .faults
            .iter()
            .filter(|x| x.what.starts_with("quote"))
            .count();
        writeln!(
            f,
            "  quote service: {quote_phases} changes (healthy / failing / hanging / slow)"
        )?;
        match &fig.network {
            Some(network) => writeln!(
                f,
                "  {}; {} connection(s) reset right after COMMIT ({} of those COMMITs had committed)",
                network.mode, network.commit_resets, network.commit_resets_committed
            )?,
            None => writeln!(f, "  network faults: off (--no-network-faults)")?,
        }
        writeln!(
            f,
            "  the HTTP API process SIGKILLed {} time(s)",
            fig.api_kills
        )?;
        Ok(())
    }
}

/// An upgrade's deploy: the releases, then every step.
fn deploy_lines(
    f: &mut fmt::Formatter<'_>,
    deploy: &DeployFigures,
    steps: &[Fault],
) -> fmt::Result {
    writeln!(
        f,
        "\ndeploy: {} ({}) → {} ({}) and back, {} processes one at a time; {} replacements, the slowest stop {} ms",
        deploy.from.version,
        short(&deploy.from.commit),
        deploy.to.version,
        short(&deploy.to.commit),
        deploy.processes,
        deploy.replaced,
        deploy.slowest_stop_ms
    )?;
    for step in steps {
        match step.lasts_ms {
            Some(up) => writeln!(
                f,
                "  {:>7.1}s  {} (stopped in {} ms, up in {up} ms)",
                step.at_s, step.what, step.took_ms
            )?,
            None => writeln!(
                f,
                "  {:>7.1}s  {} ({} ms)",
                step.at_s, step.what, step.took_ms
            )?,
        }
    }
    if !deploy.phases.is_empty() {
        writeln!(f, "\nitems finished in each stretch of the deploy")?;
    }
    for phase in &deploy.phases {
        let counts: Vec<String> = Workflow::ALL
            .iter()
            .map(|w| {
                format!(
                    "{} {}",
                    w.name(),
                    phase.finished.get(w.name()).unwrap_or(&0)
                )
            })
            .collect();
        writeln!(
            f,
            "  {:>6.1}–{:<6.1}s  {:<40} {}",
            phase.from_s,
            phase.to_s,
            phase.name,
            counts.join(", ")
        )?;
    }
    Ok(())
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}
