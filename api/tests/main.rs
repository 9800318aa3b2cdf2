// One test binary for the crate's tests: a binary per file links the whole workspace once per
// file (some 100 MB apiece, enough to fill a CI machine's disk). nextest still runs every test
// in a process of its own.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

mod activity;
mod admin;
mod admin_auth;
mod approvals;
mod bonuses;
mod console;
mod console_sign_in;
mod dead_letters;
mod functions;
mod identity;
mod intake;
mod lambda_binary;
mod markets;
mod openapi;
mod ops;
mod ops_log;
mod p2p;
mod partner;
mod partner_pages;
mod search;
mod server;
