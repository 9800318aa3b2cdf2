//! MariaDB's redo log under the soak: how far its checkpoint trails the log
//! (`Innodb_checkpoint_age` against `Innodb_checkpoint_max_age`, the age at which InnoDB makes
//! every writer wait until enough dirty pages are flushed) and the dirty pages in the buffer
//! pool, per sample and, per window, at their highest.
//!
//! Why: a soak's window can hold a stall of a second or more in which every connection of five
//! processes waits at once, on statements sharing no row. The disk's counters (`disk.rs`) tell
//! a slow device apart; a checkpoint that caught up with the log's end stalls every writer on
//! a healthy disk, and shows here as an age near 100 % of the maximum.

use serde::Serialize;
use sqlx::MySqlPool;

/// One reading of the server's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct RedoPressure {
    /// Bytes of redo log written since the last checkpoint.
    pub(crate) checkpoint_age: u64,
    /// The age at which writers wait for the flush (MariaDB's `Innodb_checkpoint_max_age`).
    pub(crate) checkpoint_max_age: u64,
    pub(crate) dirty_pages: u64,
    pub(crate) total_pages: u64,
}

/// The status variables [`RedoPressure`] is read from (MariaDB's names; MySQL 8 has no
/// `Innodb_checkpoint_*`, and the soak always runs a MariaDB of its own).
const STATUS: &str = "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_checkpoint_age', \
                      'Innodb_checkpoint_max_age', 'Innodb_buffer_pool_pages_dirty', \
                      'Innodb_buffer_pool_pages_total')";

impl RedoPressure {
    /// None where the server does not report them.
    pub(crate) async fn read(pool: &MySqlPool) -> Option<Self> {
        match sqlx::query_as::<_, (String, String)>(STATUS)
            .fetch_all(pool)
            .await
        {
            Ok(rows) => Self::from_status(&rows),
            Err(e) => {
                tracing::warn!(error = %e, "soak: InnoDB's redo status not read");
                None
            }
        }
    }

    fn from_status(rows: &[(String, String)]) -> Option<Self> {
        let value = |name: &str| {
            rows.iter()
                .find(|(variable, _)| variable.eq_ignore_ascii_case(name))?
                .1
                .parse::<u64>()
                .ok()
        };
        Some(Self {
            checkpoint_age: value("Innodb_checkpoint_age")?,
            checkpoint_max_age: value("Innodb_checkpoint_max_age").filter(|&max| max > 0)?,
            dirty_pages: value("Innodb_buffer_pool_pages_dirty")?,
            total_pages: value("Innodb_buffer_pool_pages_total").filter(|&total| total > 0)?,
        })
    }

    fn checkpoint_percent(&self) -> f64 {
        100.0 * self.checkpoint_age as f64 / self.checkpoint_max_age as f64
    }

    fn dirty_percent(&self) -> f64 {
        100.0 * self.dirty_pages as f64 / self.total_pages as f64
    }
}

/// A window's highest checkpoint age (percent of the maximum, and when) and dirty pages
/// (percent of the buffer pool).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct RedoWindow {
    pub(crate) max_checkpoint_percent: f64,
    /// Seconds since the load started, at the sample with the highest age.
    pub(crate) max_checkpoint_at_s: f64,
    pub(crate) max_dirty_percent: f64,
}

impl RedoWindow {
    /// From the window's samples (seconds since the start, readings); None without one.
    pub(crate) fn of(samples: &[(f64, RedoPressure)]) -> Option<Self> {
        let (at_s, highest) = samples.iter().max_by(|a, b| {
            a.1.checkpoint_percent()
                .total_cmp(&b.1.checkpoint_percent())
        })?;
        Some(Self {
            max_checkpoint_percent: highest.checkpoint_percent(),
            max_checkpoint_at_s: *at_s,
            max_dirty_percent: samples
                .iter()
                .map(|(_, reading)| reading.dirty_percent())
                .fold(0.0, f64::max),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_four_status_variables_make_a_reading() {
        // As this machine's MariaDB 10.11 printed them, in its order.
        let rows = status(&[
            ("Innodb_buffer_pool_pages_dirty", "812"),
            ("Innodb_buffer_pool_pages_total", "16224"),
            ("Innodb_checkpoint_age", "40409764"),
            ("Innodb_checkpoint_max_age", "80819529"),
        ]);
        let reading = RedoPressure::from_status(&rows).expect("all four");
        assert_eq!(reading.checkpoint_age, 40_409_764);
        assert!((reading.checkpoint_percent() - 50.0).abs() < 0.001);
        assert!((reading.dirty_percent() - 5.005).abs() < 0.001);
    }

    #[test]
    fn a_server_without_them_gives_no_reading() {
        // MySQL 8 has no Innodb_checkpoint_*; a zero maximum would divide by zero.
        let mysql = status(&[
            ("Innodb_buffer_pool_pages_dirty", "1"),
            ("Innodb_buffer_pool_pages_total", "8192"),
        ]);
        assert_eq!(RedoPressure::from_status(&mysql), None);
        let zero = status(&[
            ("Innodb_buffer_pool_pages_dirty", "1"),
            ("Innodb_buffer_pool_pages_total", "8192"),
            ("Innodb_checkpoint_age", "5"),
            ("Innodb_checkpoint_max_age", "0"),
        ]);
        assert_eq!(RedoPressure::from_status(&zero), None);
    }

    #[test]
    fn the_window_keeps_its_highest_age_and_when_it_was() {
        let reading = |age, dirty| RedoPressure {
            checkpoint_age: age,
            checkpoint_max_age: 1_000,
            dirty_pages: dirty,
            total_pages: 100,
        };
        let window = RedoWindow::of(&[
            (300.0, reading(200, 9)),
            (305.0, reading(970, 40)),
            (310.0, reading(100, 45)),
        ])
        .expect("three readings");
        assert!((window.max_checkpoint_percent - 97.0).abs() < 1e-9);
        assert_eq!(window.max_checkpoint_at_s, 305.0);
        assert!((window.max_dirty_percent - 45.0).abs() < 1e-9);
        assert_eq!(RedoWindow::of(&[]), None);
    }
}
