//! Per-function outcome counters and handler latency, kept in the process. The log line of
//! each outcome carries the same facts for log-based metrics (CloudWatch in Lambda).

use std::{
    collections::BTreeMap,
    sync::{Mutex, OnceLock},
    time::Duration,
};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub count: u64,
    pub total_micros: u64,
    pub max_micros: u64,
}

type Key = (String, &'static str);

fn registry() -> &'static Mutex<BTreeMap<Key, Stat>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<Key, Stat>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

pub fn record(function: &str, outcome: &'static str, elapsed: Duration) {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let mut map = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let stat = map.entry((function.to_owned(), outcome)).or_default();
    stat.count += 1;
    stat.total_micros = stat.total_micros.saturating_add(micros);
    stat.max_micros = stat.max_micros.max(micros);
}

/// (function, outcome) → stat, sorted.
pub fn snapshot() -> Vec<(String, &'static str, Stat)> {
    let map = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    map.iter().map(|((f, o), s)| (f.clone(), *o, *s)).collect()
}

/// How many messages of `function` ended with `outcome` in this process.
pub fn count(function: &str, outcome: &str) -> u64 {
    snapshot()
        .into_iter()
        .filter(|(f, o, _)| f == function && *o == outcome)
        .map(|(_, _, s)| s.count)
        .sum()
}
