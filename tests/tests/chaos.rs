//! `paybus-lab chaos --quick` as CI runs it: the real binaries against a MariaDB and a RabbitMQ of
//! the run's own (never the shared test services, which it would restart), every message
//! three times, malformed ones, SIGKILLs, a broker and a database restart. It passes on this
//! build; with one function swapped for a deliberately broken build it fails, naming what
//! broke: the seed's read-then-update confirmation (a double debit), and a match-deposit that
//! releases a fill when createTrade times out (an orphan trade). The harness can fail.
//!
//! Needs the workspace's binaries built (`cargo nextest run --workspace` builds them: every
//! package with integration tests gets its binaries built, `paybus-lab` and the functions
//! included).

use lab_run::quick_run;
use serde_json::Value;

use crate::lab_run;

const BROKEN_CONFIRM_WITHDRAWAL: &str = env!("CARGO_BIN_EXE_confirm-withdrawal-read-then-update");
const BROKEN_MATCH_DEPOSIT: &str = env!("CARGO_BIN_EXE_match-deposit-releases-on-timeout");

/// A broken build's run: its faults are the duplicates and late answers of every run, no
/// service restarts, a short window and a short bound on quiescence (a broken build may never
/// be quiet).
const BROKEN_BUILD_RUN: [&str; 8] = [
    "--broker-restarts",
    "0",
    "--database-restarts",
    "0",
    "--fault-window-s",
    "10",
    "--quiescence-timeout-s",
    "45",
];

/// `paybus-lab chaos --quick --json` with `args` in `.local/<state>`.
fn chaos(state: &str, args: &[&str]) -> (i32, Value) {
    quick_run("chaos", state, args)
}

/// The names of the run's violations.
fn checks(report: &Value) -> Vec<&str> {
    report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["check"].as_str().unwrap())
        .collect()
}

/// createTrade calls the quote service answered with a trade after the client's timeout.
fn late_trades(report: &Value) -> u64 {
    report["figures"]["late_trades"].as_u64().unwrap()
}

/// The network faults in the fault log whose line contains `what`.
fn network_faults(report: &Value, what: &str) -> usize {
    report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["what"].as_str().unwrap())
        .filter(|line| line.starts_with("network: ") && line.contains(what))
        .count()
}

fn faults_named(report: &Value, prefix: &str) -> usize {
    report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["what"].as_str().unwrap().starts_with(prefix))
        .count()
}

#[test]
fn every_workflow_comes_out_exactly_once_under_duplicates_crashes_and_restarts() {
    let (code, report) = chaos("chaos-test-pass", &["--seed", "13"]);

    assert_eq!(report["violations"], Value::Array(vec![]), "{report:#}");
    assert_eq!(code, 0);
    // The run was not a quiet one: every kind of fault happened.
    assert!(faults_named(&report, "SIGKILL") >= 3, "{report:#}");
    assert_eq!(faults_named(&report, "broker restart"), 1);
    assert_eq!(faults_named(&report, "database restart (SIGKILL)"), 1);
    assert!(report["figures"]["malformed_injected"].as_u64().unwrap() >= 1);
    assert!(report["figures"]["copies_published"].as_u64().unwrap() >= 2 * 200);
    // The quote service traded and answered after the client's timeout: the pass covers
    // principle 12's unknown outcome (settled under the same key, never released).
    assert!(late_trades(&report) >= 1, "{report:#}");
    // The API process was killed mid-load, and every client request still ended.
    assert!(
        report["figures"]["api_kills"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
    // The partners' endpoint took notifications and answered too late: each came again under
    // its id (no notification under two ids: the checks).
    let webhooks = &report["figures"]["webhooks"];
    assert!(
        webhooks["answered_late"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
    assert!(
        webhooks["accepted_again"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
    // Network faults: the report says which mechanisms ran, and each kind was applied —
    // through the kernel where namespaces can be made (as root on these machines), by the
    // relays elsewhere (loss then says it was not applied).
    let network = &report["figures"]["network"];
    let mode = network["mode"].as_str().unwrap();
    eprintln!("{mode}");
    assert!(mode.starts_with("network faults: "), "{mode}");
    for kind in [
        "latency",
        "loss",
        "partition from the database",
        "COMMIT",
        "kill the sockets",
    ] {
        assert_eq!(network_faults(&report, kind), 1, "{kind}: {report:#}");
    }
    assert!(
        network["commit_resets"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
    let malformed: i64 = report["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["reason"] == "malformed")
        .map(|d| d["count"].as_i64().unwrap())
        .sum();
    assert!(malformed >= report["figures"]["malformed_injected"].as_i64().unwrap());
}

#[test]
fn every_workflow_comes_out_exactly_once_on_four_shards_too() {
    // Exactly-once does not depend on the shard layout: the same quick profile with every
    // function's messages over four queues (a consumer per shard in every process, the
    // duplicates published onto the original's shard).
    let (code, report) = chaos("chaos-test-shards", &["--seed", "13", "--shards", "4"]);

    assert_eq!(report["violations"], Value::Array(vec![]), "{report:#}");
    assert_eq!(code, 0);
    assert_eq!(report["profile"]["shards"], 4);
    assert!(faults_named(&report, "SIGKILL") >= 3, "{report:#}");
    assert!(report["figures"]["copies_published"].as_u64().unwrap() >= 2 * 200);
    assert!(late_trades(&report) >= 1, "{report:#}");
}

#[test]
fn the_seeds_read_then_update_confirmation_is_caught_as_a_double_debit() {
    let substitute = format!("confirm-withdrawal={BROKEN_CONFIRM_WITHDRAWAL}");
    // Only the duplicates are needed to expose it: no service restarts, a short window. Its
    // notifications bypass the outbox (the seed's design), so they wait for the due sweep and
    // the run is not quiet soon: a short bound keeps the test short.
    let (code, report) = chaos(
        "chaos-test-broken",
        &[&["--substitute", &substitute][..], &BROKEN_BUILD_RUN[..]].concat(),
    );

    assert_eq!(code, 1, "{report:#}");
    let checks = checks(&report);
    assert!(
        checks.contains(&"audit:withdrawal_debited_twice"),
        "no double debit found: {checks:?}"
    );
}

#[test]
fn a_match_deposit_that_releases_its_fill_on_a_create_trade_timeout_is_caught_as_an_orphan_trade() {
    let substitute = format!("match-deposit={BROKEN_MATCH_DEPOSIT}");
    // Only the late trades are needed to expose it: no service restarts, a short window. It
    // misreads only its first send of a fill (a resend of a fill found TRADING looks the key
    // up whatever the classification says), and the sweeper's real code takes some of the
    // trades, so the run's first 40, not 5, are answered after the client's timeout: with 5,
    // a run whose late answers all went to the sweeper passed (seen once in a suite). Its
    // released orders are retried after the 5 s backoff by the sweeper, which finds the trade
    // under the same key and settles it: the books end clean, only the history shows the orphan.
    // No kills and no network faults: a suite run (2026-12-05) found no orphan when a 12-s
    // partition from the database and the SIGKILLs left the late trades to the sweeper's
    // correct code; the hazard under test needs only the late answers.
    let (code, report) = chaos(
        "chaos-test-broken-p2p",
        &[
            &["--substitute", &substitute, "--late-trades-first", "40"][..],
            &["--kill-every-ms", "0", "--no-network-faults"][..],
            &BROKEN_BUILD_RUN[..],
        ]
        .concat(),
    );

    assert_eq!(code, 1, "{report:#}");
    assert!(late_trades(&report) >= 1, "{report:#}");
    let checks = checks(&report);
    assert!(
        checks.contains(&"reconcile:p2p_orphan_trade"),
        "no orphan trade found: {checks:?}\n{report:#}"
    );
}
