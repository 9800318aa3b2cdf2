//! The disk under the run's MariaDB: its write and flush (fsync) counters from
//! `/proc/diskstats`, and per window the slowest stretch between two samples.
//!
//! Why: a soak's window can hold a stall of a second or more in which every connection of
//! five processes waits at once, and without this nothing on record says whether the disk
//! stalled or the server. A stalled disk shows here as a stretch whose mean flush time is many
//! times the window's.

use std::{os::unix::fs::MetadataExt, path::Path};

use serde::Serialize;

/// A block device, as `/proc/diskstats` names it: major and minor number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Device {
    major: u64,
    minor: u64,
}

impl Device {
    /// The device holding `path` (Linux's `dev_t` encoding).
    pub(crate) fn of(path: &Path) -> Option<Self> {
        let dev = std::fs::metadata(path).ok()?.dev();
        Some(Self {
            major: ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
            minor: (dev & 0xff) | ((dev >> 12) & !0xff),
        })
    }

    pub(crate) fn counters(self) -> Option<DiskCounters> {
        DiskCounters::parse(&std::fs::read_to_string("/proc/diskstats").ok()?, self)
    }
}

/// A device's cumulative counters since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct DiskCounters {
    pub(crate) writes: u64,
    pub(crate) write_ms: u64,
    /// Flush requests (what an fsync becomes) and their time: 0 on kernels before 5.5.
    pub(crate) flushes: u64,
    pub(crate) flush_ms: u64,
}

impl DiskCounters {
    /// `device`'s line of a `/proc/diskstats` text (the kernel's iostats.rst: after major,
    /// minor and name, field 5 is writes completed, 8 the ms spent writing, 16 flush requests
    /// completed, 17 the ms spent flushing).
    fn parse(diskstats: &str, device: Device) -> Option<Self> {
        diskstats.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
            if number(0)? != device.major || number(1)? != device.minor {
                return None;
            }
            let field = |n: usize| number(2 + n);
            Some(Self {
                writes: field(5)?,
                write_ms: field(8)?,
                flushes: field(16).unwrap_or(0),
                flush_ms: field(17).unwrap_or(0),
            })
        })
    }
}

/// The disk in one window: the mean write and flush time over the whole window and over its
/// slowest stretch between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct DiskWindow {
    pub(crate) write_ms: f64,
    pub(crate) flush_ms: f64,
    pub(crate) worst_write_ms: f64,
    pub(crate) worst_flush_ms: f64,
    /// Seconds since the load started, at the end of the stretch with the slowest flushes.
    pub(crate) worst_flush_at_s: f64,
}

fn mean(ms: u64, count: u64) -> Option<f64> {
    (count > 0).then(|| ms as f64 / count as f64)
}

impl DiskWindow {
    /// From the window's samples (seconds since the start, counters), the last one of the
    /// previous window first; None without two samples that read the disk.
    pub(crate) fn of(samples: &[(f64, DiskCounters)]) -> Option<Self> {
        let (first, last) = (samples.first()?, samples.last()?);
        let span = |a: &DiskCounters, b: &DiskCounters| {
            (
                mean(
                    b.write_ms.saturating_sub(a.write_ms),
                    b.writes.saturating_sub(a.writes),
                ),
                mean(
                    b.flush_ms.saturating_sub(a.flush_ms),
                    b.flushes.saturating_sub(a.flushes),
                ),
            )
        };
        let (write_ms, flush_ms) = span(&first.1, &last.1);
        let mut window = Self {
            write_ms: write_ms?,
            flush_ms: flush_ms.unwrap_or(0.0),
            worst_write_ms: 0.0,
            worst_flush_ms: 0.0,
            worst_flush_at_s: first.0,
        };
        for pair in samples.windows(2) {
            let (write, flush) = span(&pair[0].1, &pair[1].1);
            window.worst_write_ms = window.worst_write_ms.max(write.unwrap_or(0.0));
            if let Some(flush) = flush.filter(|&ms| ms > window.worst_flush_ms) {
                window.worst_flush_ms = flush;
                window.worst_flush_at_s = pair[1].0;
            }
        }
        Some(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_of_the_device_gives_its_write_and_flush_counters() {
        // This machine's, on the day: vda, then a partition of another disk.
        let diskstats = "\
 254       0 vda 2887897 95644 149953218 5441548 70583760 3947285 741282344 11837242 1 5778660 21171674 1434533 1226 323934616 401198 25511066 3491684
   8       1 sda1 10 0 80 5 20 0 160 9 0 12 14
";
        let vda = Device {
            major: 254,
            minor: 0,
        };
        assert_eq!(
            DiskCounters::parse(diskstats, vda),
            Some(DiskCounters {
                writes: 70_583_760,
                write_ms: 11_837_242,
                flushes: 25_511_066,
                flush_ms: 3_491_684,
            })
        );
        // An old kernel's line has no flush fields.
        let sda1 = Device { major: 8, minor: 1 };
        let old = DiskCounters::parse(diskstats, sda1).expect("found");
        assert_eq!((old.writes, old.write_ms, old.flushes), (20, 9, 0));
        assert_eq!(
            DiskCounters::parse(diskstats, Device { major: 8, minor: 2 }),
            None
        );
    }

    fn at(s: f64, writes: u64, write_ms: u64, flushes: u64, flush_ms: u64) -> (f64, DiskCounters) {
        (
            s,
            DiskCounters {
                writes,
                write_ms,
                flushes,
                flush_ms,
            },
        )
    }

    #[test]
    fn a_stalled_stretch_stands_out_from_the_window_mean() {
        // 10-s samples, 1,000 flushes of 0.1 ms each, except one stretch where 10 flushes
        // waited 1.6 s each.
        let samples = [
            at(300.0, 0, 0, 0, 0),
            at(310.0, 1_000, 200, 1_000, 100),
            at(320.0, 2_000, 400, 1_010, 16_100),
            at(330.0, 3_000, 600, 2_010, 16_200),
        ];
        let window = DiskWindow::of(&samples).expect("measured");
        assert!((window.worst_flush_ms - 1_600.0).abs() < 1e-9, "{window:?}");
        assert_eq!(window.worst_flush_at_s, 320.0);
        assert!(window.flush_ms < 10.0, "{window:?}");
        // The window's mean weighs the stretches' means: never above the slowest.
        assert!(window.worst_flush_ms >= window.flush_ms);
        assert!((window.write_ms - 0.2).abs() < 1e-9);
        assert!((window.worst_write_ms - 0.2).abs() < 1e-9);
    }

    #[test]
    fn one_sample_or_no_writes_is_no_figure() {
        assert_eq!(DiskWindow::of(&[at(0.0, 5, 1, 5, 1)]), None);
        assert_eq!(
            DiskWindow::of(&[at(0.0, 5, 1, 5, 1), at(10.0, 5, 1, 5, 1)]),
            None
        );
    }
}
