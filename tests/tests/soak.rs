//! `paybus-lab bench soak` as CI runs it: one minute of all four workflows at a low steady
//! rate, every message three times, each function its own process, on a MariaDB and a RabbitMQ
//! of the run's own. A smoke test of the soak itself — its windows, samples, plot and ending —
//! and of exactly-once under a steady load; never of speed (no figure is compared with a
//! target here: that is the 30-minute run's job, in docs/benchmarks.md).
//!
//! Needs the workspace's binaries built, like the chaos test (`cargo nextest run --workspace`
//! builds them).

use std::{path::Path, process::Command};

use lab_run::{lab, run_for_report};
use serde_json::Value;

use crate::lab_run;

#[test]
fn a_minute_of_every_workflow_at_a_steady_rate_ends_exactly_once_with_every_figure_reported() {
    let state_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/soak-test");
    let plot = state_dir.join("soak-test.svg");
    let (code, report) = run_for_report(
        Command::new(lab())
            .args([
                "bench",
                "soak",
                "--json",
                "--minutes",
                "1",
                "--window-minutes",
                "0.25",
            ])
            // The warm-up lasts until the auditor's passes read their steady span (at most its
            // window): one 15-s window here; and
            // a pass every 10 s, so the windows have passes to report (the first one runs as
            // the sweeper starts, before the load).
            .env("PAYBUS_AUDITOR_WINDOW_SECS", "15")
            .env("PAYBUS_AUDITOR_INTERVAL_MS", "10000")
            .args(["--rate", "p2p=2", "--rate", "confirmations=20"])
            .args(["--rate", "bonuses=10", "--rate", "markets=10"])
            .args(["--sample-seconds", "5", "--state-dir"])
            .arg(&state_dir)
            .arg("--plot")
            .arg(&plot),
    );

    assert_eq!(report["violations"], Value::Array(vec![]), "{report:#}");
    assert_eq!(code, 0);
    assert_eq!(report["summary"]["stuck"], Value::Array(vec![]));
    // Four windows of 15 s, each with every workflow's figures and every process's memory.
    let windows = report["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 4, "{report:#}");
    let functions = [
        "match-deposit",
        "confirm-withdrawal",
        "confirm-deposit",
        "grant-bonus",
        "cancel-orders",
        "deliver-webhook",
        "sweeper",
        "api",
    ];
    for window in windows {
        for process in functions.iter().copied().chain(["mariadb", "rabbitmq"]) {
            assert!(
                window["rss_kib"][process].as_u64().unwrap_or(0) > 0,
                "no RSS of {process} in {window:#}"
            );
        }
        assert_eq!(window["workflows"].as_array().unwrap().len(), 4);
        assert!(!window["tables"].as_array().unwrap().is_empty());
        // The disk under MariaDB (these machines' /dev/vda): MariaDB writes in every window.
        let disk = &window["disk"];
        assert!(
            disk["write_ms"].as_f64().unwrap_or(0.0) > 0.0
                && disk["worst_flush_ms"].as_f64() >= disk["flush_ms"].as_f64(),
            "no disk figures in {window:#}"
        );
        // MariaDB's redo log: writes leave dirty pages and a checkpoint age in every window.
        let redo = &window["redo"];
        let checkpoint = redo["max_checkpoint_percent"].as_f64().unwrap_or(0.0);
        assert!(
            checkpoint > 0.0
                && checkpoint < 200.0
                && redo["max_dirty_percent"].as_f64() > Some(0.0),
            "no redo log figures in {window:#}"
        );
    }
    // The windows measured what finished (a loaded CI machine may leave one workflow behind
    // until the run goes quiet: every item ending terminal is the checks' part, above).
    let finished: u64 = windows
        .iter()
        .flat_map(|w| w["workflows"].as_array().unwrap())
        .map(|t| t["finished"].as_u64().unwrap())
        .sum();
    assert!(finished > 0, "nothing finished in any window: {report:#}");
    assert_eq!(report["summary"]["compared"], serde_json::json!([2, 4]));
    assert_eq!(windows[0]["warm_up"], Value::Bool(true));
    assert_eq!(windows[1]["warm_up"], Value::Bool(false));
    let passes: u64 = windows
        .iter()
        .map(|w| w["auditor"]["passes"].as_u64().unwrap())
        .sum();
    assert!(
        passes >= 3,
        "{passes} auditor passes in the minute: {report:#}"
    );
    assert!(report["summary"]["largest_function_rss_growth"].is_number());
    assert!(report["samples"].as_array().unwrap().len() >= 10);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("RSS MiB, by process"));
}
