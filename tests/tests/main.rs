// One test binary for the crate's tests: a binary per file links the whole workspace once per
// file (some 100 MB apiece, enough to fill a CI machine's disk). nextest still runs every test
// in a process of its own.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod lab_run;
mod outcome_counts;

mod alert_rules;
mod audit;
mod auditor;
mod bonuses_checkpoints;
mod bonuses_completion;
mod bonuses_completions;
mod bonuses_race;
mod bus;
mod chaos;
mod confirmations_race;
mod dead_letters;
mod demos;
mod foundation;
mod ledger;
mod markets_audit;
mod markets_suspension;
mod ops_log;
mod p2p_audit;
mod p2p_race;
mod production_builds;
mod retry_kit;
mod shards;
mod soak;
mod upgrade;
mod windowed_audit;
