//! Running `paybus-lab` from an end-to-end test: the binary of this build and its JSON report.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// The `paybus-lab` binary of this build (next to every function binary).
pub fn lab() -> PathBuf {
    let lab = Path::new(env!("CARGO_BIN_EXE_confirm-withdrawal-read-then-update"))
        .with_file_name("paybus-lab");
    assert!(
        lab.is_file(),
        "{} is missing: build the workspace's binaries first (cargo build --workspace --bins)",
        lab.display()
    );
    lab
}

/// Runs a lab command that prints a JSON report (`--json`) with `RUST_LOG=error`: its exit
/// code (-1 if killed by a signal) and the report; a run that printed none fails the test
/// with its exit status and output.
pub fn run_for_report(command: &mut Command) -> (i32, Value) {
    let output = command.env("RUST_LOG", "error").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        // The status says a signal apart from an exit: a run once ended after its first line
        // with no error printed.
        panic!(
            "no JSON report ({e}; {}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap_or(-1), report)
}

/// Runs `paybus-lab <run> --quick --json` (`chaos`, `upgrade`) with `args` in a state folder of
/// its own, `.local/<state>`: its exit code and report, as [`run_for_report`].
pub fn quick_run(run: &str, state: &str, args: &[&str]) -> (i32, Value) {
    let state_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.local")
        .join(state);
    run_for_report(
        Command::new(lab())
            .args([run, "--quick", "--json", "--state-dir"])
            .arg(&state_dir)
            .args(args),
    )
}
