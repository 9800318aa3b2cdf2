//! The chaos run's picture: what the system did while it was being broken, over the run's time
//! (seconds since every process was started, the fault log's clock), in three panels with every
//! fault shaded across them:
//!
//! 1. items finished per second by workflow, from the workflows' own timestamps (the soak's
//!    [`crate::finished`]: the system's view, not the clients');
//! 2. messages ready in the functions' queues (what the report's peak queue depth is the peak of);
//! 3. W1's fills in doubt (`p2p_matches` TRADING, by `(deposit_order_id, trade_key)`) and deposit
//!    orders parked IN_DOUBT for ops.
//!
//! [`Watch`] samples 2 and 3 every second from the stage's start to its end. A sample the broker
//! or the database did not answer in time is a gap in its line, never a zero: a restart shows
//! as a hole, not as an empty queue. Panel 1 is read once the run is quiet, when every item has
//! its finishing timestamp. An upgrade run adds a panel above: the processes on each release.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use paybus_bus::{Services, link::BrokerLink};
use sqlx::{MySqlPool, mysql::MySqlPoolOptions};
use tokio_util::sync::CancellationToken;

use super::{Profile, deploy::DeployFigures, faults::Fault, report::Report};
use crate::{
    finished::{Workflow, finished},
    plot::{self, Band, Figure, Line, Panel},
};

/// How often the watch samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How long a sample may wait for the broker or the database before it is a gap: less than
/// [`SAMPLE_EVERY`], so a restart costs its own seconds and never delays the samples after it.
const SAMPLE_WITHIN: Duration = Duration::from_millis(900);

/// One second of the run, as the watch saw it (`None`: not answered in time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    at: Instant,
    queued: Option<u64>,
    fills_in_doubt: Option<u64>,
    orders_in_doubt: Option<u64>,
}

/// Samples the queues and the fills in doubt every second until the stage's stop.
pub(crate) struct Watch {
    /// When it started, on the monotonic and on the wall clock: the wall clock is the
    /// database's (same machine; sqlx's sessions are in UTC), which the throughput is read in.
    origin: (Instant, DateTime<Utc>),
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What the watch saw, once it stopped.
pub(crate) struct Recording {
    origin: (Instant, DateTime<Utc>),
    samples: Vec<Sample>,
}

impl Watch {
    pub(crate) fn start(services: &Services, stop: CancellationToken) -> Self {
        let origin = (Instant::now(), Utc::now());
        let samples = Arc::new(Mutex::new(Vec::new()));
        let queues: Vec<String> = paybus_catalog::queues(&services.settings.broker.shards)
            .iter()
            .map(|q| q.queue())
            .collect();
        let link = services.link.clone();
        // A connection of its own, not one of the harness's pool: a watcher must neither take
        // a connection from the load it watches (the API's requests exhaust that pool on a
        // loaded run) nor wait behind them.
        let pool = MySqlPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(SAMPLE_WITHIN)
            .connect_lazy_with((*services.pool.connect_options()).clone());
        let task = tokio::spawn({
            let samples = samples.clone();
            async move {
                let mut ticks = tokio::time::interval(SAMPLE_EVERY);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        _ = ticks.tick() => {}
                    }
                    let at = Instant::now();
                    let (queued, in_doubt) = tokio::join!(
                        tokio::time::timeout(SAMPLE_WITHIN, queued(&link, &queues)),
                        tokio::time::timeout(SAMPLE_WITHIN, in_doubt(&pool)),
                    );
                    let (fills_in_doubt, orders_in_doubt) = match in_doubt {
                        Ok(Ok((fills, orders))) => (Some(fills), Some(orders)),
                        _ => (None, None),
                    };
                    lock(&samples).push(Sample {
                        at,
                        queued: queued.ok().flatten(),
                        fills_in_doubt,
                        orders_in_doubt,
                    });
                }
                pool.close().await;
            }
        });
        Self {
            origin,
            samples,
            task,
        }
    }

    /// Waits for the watch to end (after the stage's stop) and takes its samples.
    pub(crate) async fn finish(self) -> Recording {
        // A task that panicked leaves the samples it took: the picture shows up to there.
        let _ = self.task.await;
        let samples = std::mem::take(&mut *lock(&self.samples));
        Recording {
            origin: self.origin,
            samples,
        }
    }
}

impl Recording {
    /// The most messages ready in the functions' queues at once.
    pub(crate) fn peak_queue_depth(&self) -> u64 {
        self.samples
            .iter()
            .filter_map(|s| s.queued)
            .max()
            .unwrap_or(0)
    }

    /// `at` (after the watch started) on the wall clock: the database's timestamps' clock.
    fn wall(&self, at: Instant) -> DateTime<Utc> {
        let (origin, wall) = self.origin;
        chrono::Duration::from_std(at.saturating_duration_since(origin))
            .ok()
            .and_then(|since| wall.checked_add_signed(since))
            .unwrap_or(wall)
    }
}

/// Messages ready in `queues` (None if the broker did not answer for one of them: a sum
/// without it would pass for a smaller backlog).
async fn queued(link: &BrokerLink, queues: &[String]) -> Option<u64> {
    let channel = link.current().connection.create_channel().await.ok()?;
    let mut sum = Some(0_u64);
    for queue in queues {
        match super::broker::ready(&channel, queue).await {
            Ok(n) => sum = sum.map(|sum| sum + u64::from(n)),
            // The passive declare's failure closed the channel: the others cannot be read.
            Err(_) => {
                sum = None;
                break;
            }
        }
    }
    let _ = channel.close(200, "sampled".into()).await;
    sum
}

/// W1's fills whose trade is in doubt and its deposit orders parked IN_DOUBT (the states of
/// migration `p2p_trades_in_doubt`).
async fn in_doubt(pool: &MySqlPool) -> Result<(u64, u64), sqlx::Error> {
    let (fills, orders): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT COUNT(DISTINCT deposit_order_id, trade_key) FROM p2p_matches \
                 WHERE status = 'TRADING'), \
                (SELECT COUNT(*) FROM p2p_deposit_orders WHERE status = 'IN_DOUBT')",
    )
    .fetch_one(pool)
    .await?;
    Ok((
        u64::try_from(fills).unwrap_or(0),
        u64::try_from(orders).unwrap_or(0),
    ))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Items finished per second by one workflow: (bucket's middle, rate).
type Throughput = (Workflow, Vec<(f64, f64)>);

/// The run's picture, read: every line on the run's clock.
pub(crate) struct Timeline {
    end_s: f64,
    bucket_s: f64,
    /// Items finished per second per workflow, or why they could not be read.
    throughput: Result<Vec<Throughput>, String>,
    queued: Vec<(f64, Option<f64>)>,
    fills_in_doubt: Vec<(f64, Option<f64>)>,
    orders_in_doubt: Vec<(f64, Option<f64>)>,
    /// The function processes by network slot (a network fault names its slot).
    slots: Vec<String>,
}

impl Timeline {
    /// The run from `zero` (when every process had been started: the fault log's clock) to
    /// now, with the throughput read from `pool`. Never fails: a throughput that could not be
    /// read is drawn as such. `slots`: the function processes by network slot.
    pub(crate) async fn read(
        pool: &MySqlPool,
        recording: &Recording,
        zero: Instant,
        slots: Vec<String>,
    ) -> Self {
        let now = Instant::now();
        let end_s = now.saturating_duration_since(zero).as_secs_f64().max(1.0);
        let bucket_s = bucket_for(end_s);
        // Samples from before `zero` are the fleet's start-up: not the run's.
        let line = |value: fn(&Sample) -> Option<u64>| -> Vec<(f64, Option<f64>)> {
            recording
                .samples
                .iter()
                .filter(|s| s.at >= zero)
                .map(|s| {
                    let at_s = s.at.saturating_duration_since(zero).as_secs_f64();
                    (at_s, value(s).map(|v| v as f64))
                })
                .collect()
        };
        let (from, to) = (recording.wall(zero), recording.wall(now));
        let throughput = async {
            let mut all = Vec::with_capacity(Workflow::ALL.len());
            for workflow in Workflow::ALL {
                let items = finished(pool, workflow, from, to)
                    .await
                    .map_err(|e| format!("{} not read: {e}", workflow.name()))?;
                let at_us = items.iter().map(|item| item.at_us);
                all.push((workflow, per_second(at_us, bucket_s, end_s)));
            }
            Ok(all)
        }
        .await;
        Self {
            end_s,
            bucket_s,
            throughput,
            queued: line(|s| s.queued),
            fills_in_doubt: line(|s| s.fills_in_doubt),
            orders_in_doubt: line(|s| s.orders_in_doubt),
            slots,
        }
    }

    /// The run's faults as bands ([`bands`]); more may be added before drawing.
    pub(crate) fn bands(&self, report: &Report) -> Vec<Band> {
        bands(&report.faults, &report.profile, &self.slots)
    }

    /// Why the throughput panel is empty, if it is.
    pub(crate) fn throughput_error(&self) -> Option<&str> {
        self.throughput.as_ref().err().map(String::as_str)
    }

    /// The picture: the title names the profile, the seed and the verdict.
    pub(crate) fn figure(&self, report: &Report, bands: Vec<Band>) -> Figure {
        let p = &report.profile;
        let throughput_caption = format!(
            "finished per second, by workflow (the workflows' own timestamps, {:.0} s buckets)",
            self.bucket_s
        );
        let throughput = match &self.throughput {
            Ok(series) => Panel::new(
                throughput_caption,
                series
                    .iter()
                    .map(|(workflow, points)| Line::new(workflow.name(), points.iter().copied()))
                    .collect(),
            ),
            Err(e) => Panel::new(format!("{throughput_caption}: {e}"), Vec::new()),
        };
        let end_s = bands
            .iter()
            .map(|b| b.end_s.max(b.start_s))
            .fold(self.end_s, f64::max);
        let (run, versions) = match &report.deploy {
            Some(deploy) => (
                format!(
                    "upgrade {} → {} and back",
                    deploy.from.version, deploy.to.version
                ),
                Some(versions_panel(deploy, end_s)),
            ),
            None => ("chaos".to_owned(), None),
        };
        Figure {
            title: format!(
                "paybus {run}: {} profile, seed {}, {} items, every message ×{} — {}",
                p.name,
                p.seed,
                p.items,
                p.copies,
                if report.passed() {
                    "PASSED".to_owned()
                } else {
                    format!("FAILED ({} violations)", report.violations.len())
                }
            ),
            size: (1400, 1150),
            x_desc: "seconds since the processes started (a gap: not answered)".to_owned(),
            end_s,
            panels: versions
                .into_iter()
                .chain([
                    throughput,
                    Panel::new(
                        "messages ready in the functions' queues",
                        vec![Line::with_gaps("ready", self.queued.iter().copied())],
                    ),
                    Panel::new(
                        "fills in doubt (W1: createTrade's outcome unknown)",
                        vec![
                            Line::with_gaps("fills TRADING", self.fills_in_doubt.iter().copied()),
                            Line::with_gaps(
                                "deposit orders IN_DOUBT (parked for ops)",
                                self.orders_in_doubt.iter().copied(),
                            ),
                        ],
                    ),
                ])
                .collect(),
            marks: Vec::new(),
            bands,
            bands_caption: if report.deploy.is_some() {
                "deploy:"
            } else {
                "faults:"
            },
            kinds: match report.deploy {
                Some(_) => DEPLOY_KINDS.map(String::from).to_vec(),
                None => KINDS.map(String::from).to_vec(),
            },
        }
    }

    /// Writes the picture to `path`.
    pub(crate) fn draw(
        &self,
        report: &Report,
        bands: Vec<Band>,
        path: &std::path::Path,
    ) -> anyhow::Result<()> {
        let figure = self.figure(report, bands);
        // A picture is never worth the run's report: plotters asserts on some inputs (a
        // degenerate range), so a panic in it is an error here, not the end of the run.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plot::draw(&figure, path)))
            .map_err(|_| anyhow::anyhow!("the plotting library panicked"))?
    }
}

/// An upgrade's processes on each release over the run, as steps: each replacement moves
/// one process from one line to the other.
fn versions_panel(deploy: &DeployFigures, end_s: f64) -> Panel {
    let processes = deploy.processes as f64;
    let mut on_new: Vec<(f64, f64)> = Vec::new();
    for &(at_s, n) in &deploy.on_new {
        if let Some(&(_, before)) = on_new.last() {
            on_new.push((at_s, before));
        }
        on_new.push((at_s, n as f64));
    }
    if let Some(&(_, last)) = on_new.last() {
        on_new.push((end_s, last));
    }
    let on_old = on_new.iter().map(|&(at_s, n)| (at_s, processes - n));
    Panel::new(
        format!(
            "processes running each release (the API, the sweeper and every function: {})",
            deploy.processes
        ),
        vec![
            Line::new(deploy.from.version.clone(), on_old),
            Line::new(deploy.to.version.clone(), on_new.clone()),
        ],
    )
}

/// A bucket of whole seconds giving about 60 of them over the run, 1 to 10 s: fine enough to
/// show a restart's hole, coarse enough that a quick run's 200 items are not all noise.
fn bucket_for(end_s: f64) -> f64 {
    (end_s / 60.0).ceil().clamp(1.0, 10.0)
}

/// Items per second in each `bucket_s` from 0 to `end_s`, at each bucket's middle, 0 where
/// nothing finished (a hole in the throughput is the point of the picture). `at_us`:
/// microseconds since 0; anything outside `[0, end_s)` is left out. The last bucket may be
/// shorter: its rate is over its own length.
fn per_second(at_us: impl IntoIterator<Item = i64>, bucket_s: f64, end_s: f64) -> Vec<(f64, f64)> {
    let buckets = (end_s / bucket_s).ceil().max(1.0) as usize;
    let mut counts = vec![0_u64; buckets];
    for at in at_us {
        let at_s = at as f64 / 1e6;
        if (0.0..end_s).contains(&at_s) {
            let n = ((at_s / bucket_s) as usize).min(buckets - 1);
            counts[n] += 1;
        }
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(n, count)| {
            let from = n as f64 * bucket_s;
            let width = (end_s - from).min(bucket_s).max(f64::EPSILON);
            (from + width / 2.0, count as f64 / width)
        })
        .collect()
}

/// The kinds of the fault log, in the order their colours are given (so a kind has the same
/// colour in every run and profile; a kind not listed comes after).
pub(crate) const KINDS: [&str; 12] = [
    "function SIGKILL",
    "broker restart",
    "database restart",
    "broker node SIGKILL",
    "webhook outage",
    "quote service",
    "network partition",
    "network latency",
    "packet loss",
    "socket kill",
    "reset after COMMIT",
    "late webhooks",
];

/// An upgrade's steps, in the order their colours are given.
const DEPLOY_KINDS: [&str; 3] = ["migrations", "deploy", "roll back"];

/// Every fault of the log as a band (kind, label, stretch). A fault that holds lasts its
/// `lasts_ms` (a restart: down from the stop or kill until the service answered; the webhook
/// outage; a partition, latency or loss); a quote service phase lasts until the next change
/// (a burst of failures is an instant: the next calls use it up); a SIGKILL, a socket kill,
/// resets after COMMIT and late webhooks (armed until used) are instants. A network fault
/// names its slot, labelled with the process in it (`slots`); one the machine could not apply
/// did not happen and is no band. A fault this does not know lasts its `took_ms`, kind
/// "other". The healthy quote phase is no fault.
pub(crate) fn bands(faults: &[Fault], profile: &Profile, slots: &[String]) -> Vec<Band> {
    let quote_changes: Vec<f64> = faults
        .iter()
        .filter(|f| f.what.starts_with("quote service"))
        .map(|f| f.at_s)
        .collect();
    faults
        .iter()
        .filter_map(|fault| {
            let next_quote = quote_changes.iter().copied().find(|&at| at > fault.at_s);
            band_of(fault, profile, slots, next_quote)
        })
        .collect()
}

fn band_of(
    fault: &Fault,
    profile: &Profile,
    slots: &[String],
    next_quote_change: Option<f64>,
) -> Option<Band> {
    let at = fault.at_s;
    // Its own length when it says (`lasts_ms`), else what is known of it.
    let lasted = |otherwise_s: f64| at + fault.lasts_ms.map_or(otherwise_s, |ms| ms as f64 / 1e3);
    let took_s = fault.took_ms as f64 / 1e3;
    if let Some(network) = fault.what.strip_prefix("network: ") {
        return network_band(network, at, lasted(0.0), slots);
    }
    let (what, failed) = match fault.what.strip_suffix(" FAILED") {
        Some(what) => (what, " FAILED"),
        None => (fault.what.as_str(), ""),
    };
    let node = || {
        what.find("(node ")
            .and_then(|i| what[i + 1..].split(')').next())
            .map(str::to_owned)
    };
    let (end, label, kind) = if let Some(name) = what.strip_prefix("SIGKILL ") {
        (at, name.to_owned(), "function SIGKILL")
    } else if what.starts_with(super::faults::BROKER_NODE_KILL) {
        (
            lasted(took_s),
            node().unwrap_or_default(),
            "broker node SIGKILL",
        )
    } else if what.starts_with("broker restart") {
        let label = node().unwrap_or_else(|| "broker".to_owned());
        (lasted(took_s), label, "broker restart")
    } else if what.starts_with("database restart") {
        (lasted(took_s), "database".to_owned(), "database restart")
    } else if what.starts_with("partner webhook endpoint answers 503") {
        let end = lasted(profile.webhook_outage.as_secs_f64());
        (end, "webhooks 503".to_owned(), "webhook outage")
    } else if let Some(late) = what.strip_prefix("partner webhook endpoint takes the next ") {
        let n = late.split(' ').next().unwrap_or_default();
        (at, format!("webhooks late ×{n}"), "late webhooks")
    } else if let Some(phase) = what.strip_prefix("quote service: ") {
        let until = next_quote_change.unwrap_or(profile.fault_window.as_secs_f64().max(at));
        if phase.starts_with("healthy") {
            return None;
        } else if let Some(first) = phase.strip_prefix("the first ") {
            // Armed at the start for the next trades, whenever they come: an instant.
            let n = first.split(' ').next().unwrap_or_default();
            (at, format!("{n} trades late"), "quote service")
        } else if phase.contains("after the client's timeout") {
            (until, "quote hangs".to_owned(), "quote service")
        } else if phase.starts_with("slow") {
            (until, "quote slow".to_owned(), "quote service")
        } else {
            (at, "quote 5xx".to_owned(), "quote service")
        }
    } else if let Some(step) = what.strip_prefix("deploy ") {
        (lasted(took_s), process_of(step), "deploy")
    } else if let Some(step) = what.strip_prefix("roll back ") {
        (lasted(took_s), process_of(step), "roll back")
    } else if what.starts_with("migrations of ") {
        (lasted(took_s), "migrations".to_owned(), "migrations")
    } else if what.starts_with("planted migration ") {
        (lasted(took_s), "planted".to_owned(), "migrations")
    } else {
        let label: String = what.chars().take(32).collect();
        (lasted(took_s), label, "other")
    };
    Some(Band::new(at, end, format!("{label}{failed}"), kind))
}

/// A network fault as the log has it (`<namespace or slot N>: <what> (<mechanism>)`, or
/// `…: not applied (why)`, or `… FAILED: why`), from `at` to `end`.
/// The process a deploy step names (`confirm-withdrawal: 0.3.0 → 0.4.0`).
fn process_of(step: &str) -> String {
    step.split(':').next().unwrap_or(step).to_owned()
}

fn network_band(text: &str, at: f64, end: f64, slots: &[String]) -> Option<Band> {
    let (place, what) = text.split_once(": ")?;
    if what.contains(": not applied (") {
        return None;
    }
    // A namespace is `pbc<pid><letter>-<slot>`.
    let slot = place
        .strip_prefix("slot ")
        .or_else(|| place.rsplit_once('-').map(|(_, slot)| slot))
        .and_then(|slot| slot.parse::<usize>().ok());
    let who = slot
        .and_then(|slot| slots.get(slot))
        .map_or(place, String::as_str);
    let peer = if what.contains("database") {
        "database"
    } else if what.contains("broker") {
        "broker"
    } else {
        "?"
    };
    let (end, short, kind) = if what.starts_with("latency") {
        (end, "latency".to_owned(), "network latency")
    } else if let Some(loss) = what.strip_prefix("loss ") {
        let percent = loss.split(" each way").next().unwrap_or(loss);
        (end, format!("loss {percent}"), "packet loss")
    } else if what.starts_with("partition") {
        (end, format!("✕ {peer}"), "network partition")
    } else if what.starts_with("reset the connection right after") {
        (at, "COMMIT reset".to_owned(), "reset after COMMIT")
    } else if what.starts_with("kill the sockets") {
        (at, format!("sockets to {peer}"), "socket kill")
    } else {
        (end, what.chars().take(24).collect(), "other")
    };
    let failed = if what.contains(" FAILED") {
        " FAILED"
    } else {
        ""
    };
    Some(Band::new(at, end, format!("{who} {short}{failed}"), kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(at_s: f64, what: &str, took_ms: u64) -> Fault {
        Fault {
            at_s,
            what: what.to_owned(),
            took_ms,
            lasts_ms: None,
        }
    }

    fn profile() -> Profile {
        Profile {
            seed: 13,
            ..Profile::quick()
        }
    }

    #[test]
    fn buckets_are_whole_seconds_about_sixty_a_run_between_one_and_ten() {
        assert_eq!(bucket_for(1.0), 1.0);
        assert_eq!(bucket_for(60.0), 1.0);
        assert_eq!(bucket_for(61.0), 2.0);
        assert_eq!(bucket_for(100.0), 2.0);
        assert_eq!(bucket_for(240.0), 4.0);
        assert_eq!(bucket_for(3_600.0), 10.0);
    }

    #[test]
    fn throughput_counts_per_bucket_with_zeros_and_the_last_bucket_over_its_own_length() {
        // 5 s in buckets of 2 s: [0,2) [2,4) [4,5).
        let at_us = [
            0, 500_000, 1_999_999, 4_200_000, 4_900_000, -1, 5_000_000, 9_000_000,
        ];
        let points = per_second(at_us, 2.0, 5.0);
        assert_eq!(points, vec![(1.0, 1.5), (3.0, 0.0), (4.5, 2.0)]);
        assert_eq!(per_second([], 1.0, 0.5), vec![(0.25, 0.0)]);
    }

    fn lasting(at_s: f64, what: &str, took_ms: u64, lasts_ms: u64) -> Fault {
        Fault {
            lasts_ms: Some(lasts_ms),
            ..fault(at_s, what, took_ms)
        }
    }

    #[test]
    fn every_fault_of_the_log_is_a_band_of_its_kind_over_the_time_it_lasted() {
        let log = [
            fault(
                0.1,
                "quote service: the first 5 trades answered after the client's timeout",
                0,
            ),
            fault(
                2.0,
                "quote service: next 3 quotes 503, next 2 trades 500 (not traded), then one 422",
                0,
            ),
            fault(3.0, "SIGKILL match-deposit", 0),
            fault(
                5.0,
                "quote service: trades, then answers createTrade after the client's timeout",
                0,
            ),
            lasting(7.5, "partner webhook endpoint answers 503", 0, 6_000),
            fault(8.0, "quote service: slow (half the timeout)", 0),
            lasting(9.0, "broker restart", 4_500, 4_500),
            fault(11.0, "quote service: healthy", 0),
            lasting(
                12.0,
                "broker node SIGKILL (node 2), started again",
                3_000,
                3_000,
            ),
            lasting(13.0, "broker restart (node 3) FAILED", 1_000, 1_000),
            fault(14.0, "SIGKILL api", 0),
            lasting(18.0, "database restart (SIGKILL)", 2_250, 2_250),
            fault(20.0, "quote service: slow (half the timeout)", 0),
            fault(
                21.0,
                "partner webhook endpoint takes the next 3 notifications, answers after the sender's timeout",
                0,
            ),
            // Before the log said how long a fault held, a restart lasted its took_ms and the
            // outage the profile's.
            fault(22.0, "database restart (SIGKILL)", 1_500),
            fault(23.0, "partner webhook endpoint answers 503", 0),
            fault(24.0, "something new", 2_000),
        ];
        let bands = bands(&log, &profile(), &[]);
        let expected = [
            Band::new(0.1, 0.1, "5 trades late", "quote service"),
            Band::new(2.0, 2.0, "quote 5xx", "quote service"),
            Band::new(3.0, 3.0, "match-deposit", "function SIGKILL"),
            Band::new(5.0, 8.0, "quote hangs", "quote service"),
            Band::new(7.5, 13.5, "webhooks 503", "webhook outage"),
            Band::new(8.0, 11.0, "quote slow", "quote service"),
            Band::new(9.0, 13.5, "broker", "broker restart"),
            Band::new(12.0, 15.0, "node 2", "broker node SIGKILL"),
            Band::new(13.0, 14.0, "node 3 FAILED", "broker restart"),
            Band::new(14.0, 14.0, "api", "function SIGKILL"),
            Band::new(18.0, 20.25, "database", "database restart"),
            // The last quote phase lasts until the end of the fault window.
            Band::new(20.0, 30.0, "quote slow", "quote service"),
            Band::new(21.0, 21.0, "webhooks late ×3", "late webhooks"),
            Band::new(22.0, 23.5, "database", "database restart"),
            Band::new(23.0, 29.0, "webhooks 503", "webhook outage"),
            Band::new(24.0, 26.0, "something new", "other"),
        ];
        assert_eq!(bands, expected);
    }

    #[test]
    fn a_deploy_step_is_a_band_of_its_direction_labelled_with_its_process_over_its_replacement() {
        let steps = [
            fault(7.5, "migrations of 0.4.0: 70 known", 500),
            lasting(15.0, "deploy confirm-withdrawal: 0.3.0 → 0.4.0", 20, 1_300),
            lasting(40.0, "roll back api: 0.4.0 → 0.3.0", 25, 1_200),
        ];
        let bands = bands(&steps, &profile(), &[]);
        let found: Vec<(&str, &str, f64, f64)> = bands
            .iter()
            .map(|b| (b.kind.as_str(), b.label.as_str(), b.start_s, b.end_s))
            .collect();
        assert_eq!(
            found,
            [
                ("migrations", "migrations", 7.5, 8.0),
                ("deploy", "confirm-withdrawal", 15.0, 16.3),
                ("roll back", "api", 40.0, 41.2),
            ]
        );
    }

    #[test]
    fn a_network_fault_is_labelled_with_the_process_in_its_slot_and_one_not_applied_is_none() {
        let slots = ["match-deposit", "grant-bonus", "sweeper"].map(String::from);
        let log = [
            lasting(
                3.0,
                "network: pbc4242a-1: latency 200ms ± 50ms each way for 10s (relay)",
                5,
                10_000,
            ),
            lasting(
                6.0,
                "network: pbc4242a-2: loss 5 % each way for 10s (nft)",
                8,
                10_000,
            ),
            lasting(
                9.0,
                "network: pbc4242a-0: partition from the database for 12s (nft)",
                9,
                12_000,
            ),
            fault(
                15.0,
                "network: slot 1: reset the connection right after the next 2 COMMIT(s) (relay)",
                0,
            ),
            fault(
                18.0,
                "network: pbc4242a-2: kill the sockets to the database: 3 socket(s) killed (ss -K)",
                20,
            ),
            lasting(
                20.0,
                "network: slot 0: loss 5 % each way for 10s: not applied (no nft: missing)",
                0,
                10_000,
            ),
            lasting(
                21.0,
                "network: pbc4242a-7: partition from the broker for 20s (nft) FAILED: nft said no",
                3,
                20_000,
            ),
        ];
        let bands = bands(&log, &profile(), &slots);
        let expected = [
            Band::new(3.0, 13.0, "grant-bonus latency", "network latency"),
            Band::new(6.0, 16.0, "sweeper loss 5 %", "packet loss"),
            Band::new(9.0, 21.0, "match-deposit ✕ database", "network partition"),
            Band::new(15.0, 15.0, "grant-bonus COMMIT reset", "reset after COMMIT"),
            Band::new(18.0, 18.0, "sweeper sockets to database", "socket kill"),
            // A slot the stage does not know keeps its namespace's name.
            Band::new(
                21.0,
                41.0,
                "pbc4242a-7 ✕ broker FAILED",
                "network partition",
            ),
        ];
        assert_eq!(bands, expected);
    }

    /// A quick run as the fault schedule makes it, drawn: three panels, the strip, every
    /// kind in the legend, the verdict in the title.
    #[test]
    fn a_quick_run_draws_three_panels_under_its_faults() {
        let mut log = vec![
            lasting(7.5, "partner webhook endpoint answers 503", 0, 6_000),
            lasting(9.0, "broker restart", 6_500, 6_500),
            lasting(18.0, "database restart (SIGKILL)", 3_250, 3_250),
            lasting(
                3.0,
                "network: pbc1a-1: latency 200ms ± 50ms each way for 10s (relay)",
                5,
                10_000,
            ),
            lasting(
                9.0,
                "network: pbc1a-0: partition from the database for 12s (nft)",
                9,
                12_000,
            ),
            fault(
                15.0,
                "network: slot 1: reset the connection right after the next 2 COMMIT(s) (relay)",
                0,
            ),
            fault(12.0, "SIGKILL api", 0),
        ];
        let names = [
            "match-deposit",
            "confirm-withdrawal",
            "grant-bonus",
            "cancel-orders",
            "sweeper",
        ];
        for i in 1..10 {
            log.push(fault(
                i as f64 * 3.0,
                &format!("SIGKILL {}", names[i as usize % 5]),
                0,
            ));
        }
        let phases = [
            "quote service: next 3 quotes 503, next 2 trades 500 (not traded), then one 422",
            "quote service: trades, then answers createTrade after the client's timeout",
            "quote service: slow (half the timeout)",
            "quote service: healthy",
        ];
        for i in 0..10 {
            log.push(fault(2.0 + i as f64 * 3.0, phases[i as usize % 4], 0));
        }
        log.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let end_s = 95.0;
        let secs = |f: fn(f64) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
            (0..95).map(|i| (f64::from(i), f(f64::from(i)))).collect()
        };
        let timeline = Timeline {
            end_s,
            bucket_s: bucket_for(end_s),
            throughput: Ok(Workflow::ALL
                .into_iter()
                .enumerate()
                .map(|(n, w)| {
                    let at_us = (0..400_i64)
                        .map(|i| (i * 97_531 * (n as i64 + 1)) % 60_000_000)
                        .filter(|&us| !(18_000_000..21_000_000).contains(&us));
                    (w, per_second(at_us, bucket_for(end_s), end_s))
                })
                .collect()),
            queued: secs(|t| {
                (!(9.0..15.0).contains(&t)).then_some(if t < 40.0 {
                    50.0 + 30.0 * (t / 5.0).sin()
                } else {
                    (400.0 - 8.0 * t).max(0.0)
                })
            }),
            fills_in_doubt: secs(|t| {
                (!(18.0..21.0).contains(&t)).then_some(if (5.0..40.0).contains(&t) {
                    ((t - 5.0) / 6.0).floor().min(3.0)
                } else {
                    0.0
                })
            }),
            slots: ["match-deposit", "grant-bonus", "sweeper"]
                .map(String::from)
                .to_vec(),
            orders_in_doubt: secs(|t| {
                (!(18.0..21.0).contains(&t)).then_some(if t > 30.0 { 1.0 } else { 0.0 })
            }),
        };
        let report = Report {
            seed: 13,
            profile: profile(),
            figures: crate::chaos::report::Figures {
                load_sent: Duration::ZERO,
                time_to_quiescence: Duration::ZERO,
                total: Duration::ZERO,
                peak_queue_depth: 0,
                broker_node_kills: 0,
                messages_seen: 0,
                copies_published: 0,
                malformed_injected: 0,
                quote_calls: 0,
                trade_calls: 0,
                webhook_posts: 0,
                webhook_refused: 0,
                webhooks: Default::default(),
                network: None,
                api_kills: 0,
                late_trades: 0,
            },
            load: Default::default(),
            faults: log.clone(),
            process_exits: Vec::new(),
            counts: Default::default(),
            dead_letters: Vec::new(),
            violations: Vec::new(),
            state_dir: std::env::temp_dir(),
            timeline: None,
            timeline_not_drawn: None,
            deploy: None,
        };
        let path = std::env::temp_dir().join(format!("paybus-timeline-{}.svg", std::process::id()));
        timeline
            .draw(&report, timeline.bands(&report), &path)
            .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        for text in [
            "seed 13",
            "PASSED",
            "finished per second",
            "messages ready",
            "fills in doubt",
            "function SIGKILL",
            "database restart",
            "quote hangs",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
