//! `PAYBUS_SHARDS`: how many queues each function's messages are spread over (the queues
//! themselves are the topology's: `bus::topology`).

use std::{collections::BTreeMap, fmt};

use crate::setting::Setting;

pub const VAR_SHARDS: Setting = Setting {
    name: "PAYBUS_SHARDS",
    default: "unset",
    about: "queues per function, `function=N` pairs separated by commas \
            (`confirm-withdrawal=4`; N from 1 to 64); unset: one queue each. The topology: every \
            process of a deployment and its template must see the same value \
            ([shards](bus.md#shards))",
};

/// How many queues each function's messages are spread over: `PAYBUS_SHARDS`, e.g.
/// `confirm-withdrawal=4,grant-bonus=2`; a function not named has one queue (the default
/// topology). Every process of a deployment (and its template) must see the same value: it is
/// the topology.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shards(BTreeMap<String, u16>);

impl Shards {
    pub const VARIABLE: &'static str = VAR_SHARDS.name;
    /// More shards than this is a typo, not a deployment (each is a trigger and a queue).
    pub const MAX: u16 = 64;
    pub const EXPECTED: &'static str = "function=count pairs separated by commas, e.g. confirm-withdrawal=4, each count from 1 to 64";

    /// `function=count,...`; empty is every function unsharded.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut shards = Shards::default();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (function, count) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not function=count"))?;
            let function = function.trim();
            let count: u16 = count
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=Self::MAX).contains(n))
                .ok_or_else(|| format!("{pair:?}: the count must be from 1 to {}", Self::MAX))?;
            if function.is_empty() || shards.0.contains_key(function) {
                return Err(format!("{pair:?}: name each function once"));
            }
            shards.0.insert(function.to_owned(), count);
        }
        shards.0.retain(|_, count| *count > 1);
        Ok(shards)
    }

    /// `function` with `count` shards (1: unsharded).
    pub fn with(mut self, function: &str, count: u16) -> Self {
        if count > 1 {
            self.0.insert(function.to_owned(), count);
        } else {
            self.0.remove(function);
        }
        self
    }

    /// Shards of `function` (1 when it is not sharded).
    pub fn of(&self, function: &str) -> u16 {
        self.0.get(function).copied().unwrap_or(1)
    }

    /// The sharded functions and their counts.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u16)> {
        self.0
            .iter()
            .map(|(function, count)| (function.as_str(), *count))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The `PAYBUS_SHARDS` value (`a=4,b=2`; empty when nothing is sharded).
impl fmt::Display for Shards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.iter().map(|(fu, n)| format!("{fu}={n}")).collect();
        f.write_str(&pairs.join(","))
    }
}
