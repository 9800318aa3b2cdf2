//! `paybus-lab bench` as people run it, at the smallest size: the figures are not asserted
//! (a benchmark, not a test), only that the run completes exactly once. These integration
//! tests are also why `cargo nextest run --workspace` builds the `paybus-lab` binary that the
//! end-to-end chaos test runs.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_paybus-lab"))
        .arg("bench")
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// Runs the bench, asserts it succeeded and printed each of `phases`; its output.
fn succeeded_with_phases(args: &[&str], phases: &[&str]) -> String {
    let output = bench(args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for phase in phases {
        assert!(stdout.contains(phase), "no {phase:?} phase:\n{stdout}");
    }
    stdout
}

#[test]
fn a_small_confirm_withdrawal_bench_debits_every_withdrawal_once_with_a_clean_audit() {
    let stdout = succeeded_with_phases(
        &["confirm-withdrawal", "--items", "20", "--concurrency", "4"],
        &[
            "direct on the database (with duplicates)",
            "through the broker (with duplicates)",
            "database ceiling (oltp_write_only shape)",
        ],
    );
    assert!(
        stdout.contains("exactly once: 40 debits for 40 withdrawals, audit clean"),
        "{stdout}"
    );
    // The ceiling is the database's best: at the bench's own concurrency and at the levels
    // where it peaks, whichever is faster.
    let levels = stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("the best of: "))
        .unwrap_or_else(|| panic!("no ceiling levels:\n{stdout}"));
    let connections: Vec<&str> = levels
        .split(", ")
        .filter_map(|level| level.split(" connections").next())
        .collect();
    assert_eq!(connections, ["4", "16", "32", "64"], "{stdout}");
}

#[test]
fn a_bench_of_no_items_is_refused_before_it_starts() {
    let output = bench(&["confirm-withdrawal", "--items", "0"]);

    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("paybus-lab: --items, --concurrency and --partners must be at least 1"),
        "{stderr}"
    );
}

#[test]
fn a_small_checkpointer_bench_writes_a_checkpoint_per_member_with_a_clean_audit() {
    let stdout = succeeded_with_phases(
        &["checkpointer", "--items", "20"],
        &[
            "windowed balance check, no checkpoints",
            "checkpointer, first run",
            "checkpointer, nothing to move",
            "windowed balance check, with checkpoints",
        ],
    );
    assert!(
        stdout.contains("audit clean: 20 checkpoints, each its member's charges"),
        "{stdout}"
    );
}
