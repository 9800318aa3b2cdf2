//! Every process's resident memory (VmRSS in /proc/<pid>/status: each function is its own OS
//! process, so the figure is its own), and the anonymous part of it (RssAnon: heap and stacks,
//! what a leak grows; the rest is mapped files, mostly the binary's own pages, faulted in as
//! code paths first run and bounded by its size), the messages in the queues, the disk
//! under MariaDB (`disk`) and its redo log's checkpoint age (`redo`), sampled every few
//! seconds for the plot and at every window's end for the window.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use paybus_bus::Services;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{
    disk::{Device, DiskCounters, DiskWindow},
    redo::{RedoPressure, RedoWindow},
};
use crate::chaos::{checks, fleet::Fleet};

/// The harness's own process: the HTTP API, the load's clients and the duplicator.
pub(crate) const HARNESS: &str = "harness (clients, duplicator)";

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    /// Seconds since the load started.
    pub(crate) at_s: f64,
    /// Resident memory by process, KiB (a process restarting at that moment is missing).
    pub(crate) rss_kib: BTreeMap<String, u64>,
    /// Of it, anonymous memory (RssAnon), KiB.
    pub(crate) anon_kib: BTreeMap<String, u64>,
    /// Messages ready in every queue (the functions', their dead-letter queues, the tap).
    pub(crate) queue_depth: u64,
    /// The queues that had any, by name: where a backlog is.
    pub(crate) queues: BTreeMap<String, u64>,
    /// The disk under MariaDB's data (None where `/proc/diskstats` does not name it).
    pub(crate) disk: Option<DiskCounters>,
    /// MariaDB's checkpoint age and dirty pages (None where it did not report them).
    pub(crate) redo: Option<RedoPressure>,
}

/// A window's end: a sample then, the most messages queued at once in the window, and the
/// disk and the redo log over it.
pub(crate) struct WindowEnd {
    pub(crate) sample: Sample,
    pub(crate) peak_queue_depth: u64,
    pub(crate) disk: Option<DiskWindow>,
    pub(crate) redo: Option<RedoWindow>,
}

struct Source {
    fleet: Arc<Fleet>,
    services: Services,
    /// The run's MariaDB and RabbitMQ write their pids here (`infra/local`'s layout).
    pid_files: [(&'static str, PathBuf); 2],
    disk: Option<Device>,
    started: Instant,
}

impl Source {
    async fn sample(&self) -> Sample {
        let mut processes: Vec<(String, Option<u32>)> = self.fleet.pids();
        processes.push((HARNESS.to_owned(), Some(std::process::id())));
        for (name, file) in &self.pid_files {
            processes.push(((*name).to_owned(), pid_in(file)));
        }
        let rss_kib = processes
            .iter()
            .filter_map(|(name, pid)| Some((name.clone(), status_kib(pid.as_ref()?, "VmRSS:")?)))
            .collect();
        let anon_kib = processes
            .iter()
            .filter_map(|(name, pid)| Some((name.clone(), status_kib(pid.as_ref()?, "RssAnon:")?)))
            .collect();
        let queues: BTreeMap<String, u64> = match checks::queue_depths(&self.services).await {
            Ok(queues) => queues
                .into_iter()
                .map(|(queue, n)| (queue, u64::from(n)))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "soak: queue depths not read");
                BTreeMap::new()
            }
        };
        Sample {
            at_s: self.started.elapsed().as_secs_f64(),
            rss_kib,
            anon_kib,
            queue_depth: queues.values().sum(),
            queues,
            disk: self.disk.and_then(Device::counters),
            redo: RedoPressure::read(&self.services.pool).await,
        }
    }
}

fn pid_in(file: &Path) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The `field` (`VmRSS:`, `RssAnon:`) of `pid`'s status, KiB.
fn status_kib(pid: &u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

pub(crate) struct Sampler {
    source: Arc<Source>,
    samples: Arc<Mutex<Vec<Sample>>>,
    /// Samples already given to a window.
    windowed: Mutex<usize>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub(crate) fn start(
        fleet: Arc<Fleet>,
        services: Services,
        state_dir: &Path,
        every: Duration,
    ) -> Self {
        let source = Arc::new(Source {
            fleet,
            services,
            pid_files: [
                ("mariadb", state_dir.join("mariadb/pid")),
                ("rabbitmq", state_dir.join("rabbitmq/pid")),
            ],
            disk: Device::of(&state_dir.join("mariadb/data")),
            started: Instant::now(),
        });
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (source, samples, stop) = (source.clone(), samples.clone(), stop.clone());
            async move {
                let mut ticks = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = ticks.tick() => {}
                    }
                    let sample = source.sample().await;
                    lock(&samples).push(sample);
                }
            }
        });
        Self {
            source,
            samples,
            windowed: Mutex::new(0),
            stop,
            task,
        }
    }

    /// When the load started (the samples' clock).
    pub(crate) fn started(&self) -> Instant {
        self.source.started
    }

    /// A sample now (kept with the others), the most messages queued at once since the last
    /// window's end, the disk since then (from that window's last sample: its figures are
    /// differences) and the redo log's highest reading since then.
    pub(crate) async fn window_end(&self) -> WindowEnd {
        let now = self.source.sample().await;
        let mut samples = lock(&self.samples);
        samples.push(now.clone());
        let mut windowed = self
            .windowed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let peak_queue_depth = samples[*windowed..]
            .iter()
            .map(|s| s.queue_depth)
            .max()
            .unwrap_or(0);
        let disk: Vec<(f64, DiskCounters)> = samples[windowed.saturating_sub(1)..]
            .iter()
            .filter_map(|s| Some((s.at_s, s.disk?)))
            .collect();
        let redo: Vec<(f64, RedoPressure)> = samples[*windowed..]
            .iter()
            .filter_map(|s| Some((s.at_s, s.redo?)))
            .collect();
        *windowed = samples.len();
        WindowEnd {
            sample: now,
            peak_queue_depth,
            disk: DiskWindow::of(&disk),
            redo: RedoWindow::of(&redo),
        }
    }

    /// Stops sampling (and lets go of the fleet); every sample, in time order.
    pub(crate) async fn stop(self) -> Vec<Sample> {
        self.stop.cancel();
        let _ = self.task.await;
        let mut samples = std::mem::take(&mut *lock(&self.samples));
        samples.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        samples
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
