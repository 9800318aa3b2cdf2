//! Whose "now" the retry kit's SQL compares against.
//!
//! In production that is the database's own clock (`NOW(6)`): every process, every Lambda and
//! every row default agree on it, so a fresh row is due the moment it is written whatever the
//! application hosts' clocks say. A test injects a [`Clock::manual`] instead and moves it
//! forward: a 10-minute backoff is then due without anyone sleeping. Kit SQL writes
//! `COALESCE(?, NOW(6))` and binds [`Clock::sql_now`], so one statement serves both.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{DateTime, SubsecRound, Utc};

#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The database server's `NOW(6)`.
    #[default]
    Database,
    /// A test's clock: stands still until advanced. Start it at the database's now (or
    /// later): rows inserted with `DEFAULT CURRENT_TIMESTAMP(6)` carry the real time.
    Manual(Arc<Mutex<DateTime<Utc>>>),
}

impl Clock {
    pub fn manual(start: DateTime<Utc>) -> Self {
        Clock::Manual(Arc::new(Mutex::new(start.trunc_subsecs(6))))
    }

    /// The value to bind for `COALESCE(?, NOW(6))`: `None` lets the database decide.
    pub fn sql_now(&self) -> Option<DateTime<Utc>> {
        match self {
            Clock::Database => None,
            Clock::Manual(now) => Some(*now.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }

    /// Moves a manual clock forward (a database clock cannot be moved: no-op).
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(now) = self {
            let mut now = now.lock().unwrap_or_else(|p| p.into_inner());
            *now += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        }
    }
}

/// A duration as the whole microseconds SQL's `INTERVAL ? MICROSECOND` takes.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let start = DateTime::parse_from_rfc3339("2026-11-30T12:00:00.1234567Z")
            .map(DateTime::<Utc>::from)
            .expect("a timestamp");
        let clock = Clock::manual(start);
        let first = clock.sql_now().expect("manual");
        assert_eq!(first, start.trunc_subsecs(6));
        let copy = clock.clone();
        copy.advance(Duration::from_secs(600));
        assert_eq!(
            clock.sql_now(),
            Some(first + chrono::Duration::seconds(600))
        );
        assert_eq!(Clock::Database.sql_now(), None);
    }
}
