//! `paybus-lab chaos`'s refusals, which come before it starts any service of its own (the run
//! itself is the end-to-end `chaos` test of `paybus-e2e`).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::process::Command;

#[test]
fn a_substitute_for_no_function_is_refused_naming_the_functions() {
    let output = Command::new(env!("CARGO_BIN_EXE_paybus-lab"))
        .args([
            "chaos",
            "--quick",
            "--substitute",
            "no-such-function=/bin/true",
        ])
        .output()
        .unwrap();

    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--substitute no-such-function=...: no such function"),
        "{stderr}"
    );
    assert!(stderr.contains("confirm-withdrawal"), "{stderr}");
}
