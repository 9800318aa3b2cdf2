// One test binary for the crate's tests: a binary per file links the whole workspace once per
// file (some 100 MB apiece, enough to fill a CI machine's disk). nextest still runs every test
// in a process of its own.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod api_process;

mod api_commands;
mod audit;
mod broker_blocked;
mod configuration_page;
mod console_browser;
mod console_pages_browser;
mod dead_letter_operations;
mod doctor;
mod jobs;
mod prometheus;
mod run;
mod schemathesis;
mod secrets;
mod sign_in;
mod suspension;
mod topology;
mod trace_timelines;
mod traces;
mod version;
mod w2_intake;
