//! Where a phase's CPU went, when the database server and the broker run on this machine.
//!
//! Why: on a machine the database, the broker and the bench share (two cores here), every
//! cycle the broker spends is one the database does not get, so "through the broker / direct"
//! is mostly the broker's CPU per message. The figures say so instead of leaving it to a
//! guess.

/// Linux reports process and machine times in USER_HZ ticks, 100 per second on every
/// architecture it supports (a fixed part of the user-space ABI, unlike the kernel's HZ).
const TICKS_PER_SECOND: u64 = 100;

/// CPU time so far, in ticks: of the local database server(s), broker node(s), this process,
/// and the whole machine (busy and all).
#[derive(Clone, Copy, Default)]
pub(crate) struct CpuTimes {
    database: u64,
    broker: u64,
    this: u64,
    machine_busy: u64,
    machine_all: u64,
    cores: u64,
}

impl CpuTimes {
    /// A reading from `/proc`; zeros where it cannot be read (not Linux, another machine).
    pub(crate) fn read() -> Self {
        let mut times = Self {
            this: process_ticks("/proc/self/stat").map_or(0, |(_, ticks)| ticks),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            ..Self::default()
        };
        if let Ok(stat) = std::fs::read_to_string("/proc/stat")
            && let Some(line) = stat.lines().next()
        {
            // The machine's cores, not this process's: `--pin-broker` confines the bench to
            // some of them, and `available_parallelism` follows the affinity (pinned runs
            // printed "of 1 cores" for the whole machine's busy share).
            let cpus = stat
                .lines()
                .filter(|line| {
                    line.strip_prefix("cpu")
                        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
                })
                .count();
            if cpus > 0 {
                times.cores = cpus as u64;
            }
            let fields: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            times.machine_all = fields.iter().sum();
            // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
            times.machine_busy = times.machine_all
                - fields.get(3).copied().unwrap_or(0)
                - fields.get(4).copied().unwrap_or(0);
        }
        let servers = LocalServers::get();
        if let Some((database, broker)) = servers.pids {
            let ticks =
                |pid: u32| process_ticks(&format!("/proc/{pid}/stat")).map_or(0, |(_, t)| t);
            times.database = ticks(database);
            times.broker = ticks(broker);
            return times;
        }
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let path = entry.path().join("stat");
            let Some((name, ticks)) = process_ticks(&path.to_string_lossy()) else {
                continue;
            };
            match name.as_str() {
                "mariadbd" | "mysqld" => times.database += ticks,
                "beam.smp" => times.broker += ticks,
                _ => {}
            }
        }
        times
    }

    /// The CPU spent since this reading, per `units`, as one printable line.
    pub(crate) fn per_unit_since(&self, now: &Self, unit: &str, units: usize) -> Option<String> {
        let all = now.machine_all.saturating_sub(self.machine_all);
        if all == 0 {
            return None;
        }
        let micros = |from: u64, to: u64| {
            to.saturating_sub(from) as f64 * 1e6 / TICKS_PER_SECOND as f64 / units.max(1) as f64
        };
        let busy = now.machine_busy.saturating_sub(self.machine_busy) as f64 / all as f64;
        Some(format!(
            "cpu per {unit}: database {:.0} µs, broker {:.0} µs, this process {:.0} µs; machine busy {:.0}% of {} cores",
            micros(self.database, now.database),
            micros(self.broker, now.broker),
            micros(self.this, now.this),
            busy * 100.0,
            now.cores,
        ))
    }
}

/// The local MariaDB and RabbitMQ this bench runs on, when their pid files (`infra/local`'s,
/// under `PAYBUS_STATE_DIR`, as `--pin-broker` reads them) name live processes. Why: on a
/// machine shared with other developers, every `mariadbd` and `beam.smp` summed by name also
/// counted their test servers' work as this phase's.
struct LocalServers {
    pids: Option<(u32, u32)>,
}

impl LocalServers {
    fn get() -> &'static Self {
        static SERVERS: std::sync::OnceLock<LocalServers> = std::sync::OnceLock::new();
        SERVERS.get_or_init(|| {
            let dir = super::pinning::state_dir();
            let live = |service: &str, names: &[&str]| {
                let pid = super::pinning::pid_in(dir.join(service).join("pid")).ok()?;
                let (name, _) = process_ticks(&format!("/proc/{pid}/stat"))?;
                names.contains(&name.as_str()).then_some(pid)
            };
            Self {
                pids: live("mariadb", &["mariadbd", "mysqld"]).zip(live("rabbitmq", &["beam.smp"])),
            }
        })
    }
}

/// The command name and the user + system ticks of a `/proc/<pid>/stat` file.
fn process_ticks(path: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The name is in parentheses and may itself contain spaces or parentheses.
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state, ppid, ... utime is field 14 of the file, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::{CpuTimes, TICKS_PER_SECOND, process_ticks};

    #[test]
    fn this_process_s_own_cpu_time_is_read_and_grows_with_work() {
        let (name, _) = process_ticks("/proc/self/stat").expect("a Linux /proc");
        assert!(!name.is_empty());
        let before = CpuTimes::read();
        // Spin until 100 ms of CPU show up (however busy the machine is), or give up.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let after = loop {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            let now = CpuTimes::read();
            if (now.this - before.this) * 1000 / TICKS_PER_SECOND >= 100 {
                break now;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "a minute of spinning never showed as 100 ms of this process's CPU"
            );
        };
        assert!(after.machine_busy > before.machine_busy);
        let line = before
            .per_unit_since(&after, "message", 10)
            .expect("machine ticks moved");
        assert!(line.starts_with("cpu per message: database "), "{line}");
    }
}
