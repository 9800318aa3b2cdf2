//! `paybus-lab upgrade --quick` as CI runs it: the previous release (the commit CHANGELOG.md
//! names, built in `.local/releases/`) runs every workflow under load on services of the run's
//! own; this build's migrations are applied under it; every process is replaced by this
//! build's binary one at a time and rolled back the same way. It passes with this build's
//! migrations, and fails, naming what broke, when one more migration drops a column the
//! previous release writes: the harness can fail.
//!
//! Needs the workspace's binaries built and the previous release's too (`infra/test.sh`
//! builds them before the tests: `paybus-lab upgrade --build-only`; without them the first
//! run builds them, for minutes).

use std::path::Path;

use lab_run::quick_run;
use serde_json::Value;

use crate::lab_run;

/// `paybus-lab upgrade --quick --json` with `args` in `.local/<state>`.
fn upgrade(state: &str, args: &[&str]) -> (i32, Value) {
    quick_run("upgrade", state, args)
}

fn violations(report: &Value) -> Vec<(&str, &str)> {
    report["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["check"].as_str().unwrap(), v["detail"].as_str().unwrap()))
        .collect()
}

/// What each workflow finished in the stretches where the previous release's code ran alone
/// on this release's schema (before the rollout and after the rollback).
fn finished_by_the_previous_release_on_the_new_schema(deploy: &Value) -> Vec<(String, u64)> {
    let phases = deploy["phases"].as_array().unwrap();
    let on_new_schema: Vec<&Value> = phases
        .iter()
        .filter(|p| p["name"].as_str().unwrap().contains("'s schema"))
        .collect();
    assert_eq!(on_new_schema.len(), 2, "{phases:#?}");
    ["p2p", "confirmations", "bonuses", "markets"]
        .into_iter()
        .map(|workflow| {
            let n = on_new_schema
                .iter()
                .map(|p| p["finished"][workflow].as_u64().unwrap())
                .sum();
            (workflow.to_owned(), n)
        })
        .collect()
}

#[test]
fn a_rolling_upgrade_from_the_previous_release_and_back_under_load_loses_nothing() {
    let (code, report) = upgrade("upgrade-test-pass", &[]);
    assert!(
        violations(&report).is_empty(),
        "violations: {:#?}",
        violations(&report)
    );
    assert_eq!(code, 0);
    let deploy = &report["deploy"];
    assert_eq!(deploy["to"]["version"], env!("CARGO_PKG_VERSION"));
    assert_ne!(deploy["from"]["version"], deploy["to"]["version"]);
    // Every catalog function that takes load (the canary takes none), the sweeper and the API,
    // each replaced and rolled back.
    let processes = deploy["processes"].as_u64().unwrap();
    let expected = paybus_catalog::FUNCTIONS
        .iter()
        .filter(|f| f.name != "canary")
        .count() as u64
        + 2;
    assert_eq!(processes, expected, "{deploy:#}");
    assert_eq!(deploy["replaced"].as_u64().unwrap(), 2 * processes);
    assert!(
        deploy["migrations"]
            .as_str()
            .unwrap()
            .contains("all applied"),
        "{deploy:#}"
    );
    // The load met the previous release on the new schema in every workflow, markets
    // included (the upgrade suspends one every twentieth of the window).
    for (workflow, finished) in finished_by_the_previous_release_on_the_new_schema(deploy) {
        assert!(finished > 0, "{workflow}: {:#}", deploy["phases"]);
    }
    let timeline = std::fs::read_to_string(report["timeline"].as_str().unwrap()).unwrap();
    assert!(timeline.contains("processes running each release"));
}

#[test]
fn the_upgrade_fails_on_a_migration_that_drops_a_column_the_previous_release_writes() {
    let planted = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/upgrade/drop_a_column_the_previous_release_writes.sql");
    let (code, report) = upgrade(
        "upgrade-test-planted",
        &[
            "--plant-migration",
            planted.to_str().unwrap(),
            "--quiescence-timeout-s",
            "45",
        ],
    );
    assert_eq!(code, 1, "{report:#}");
    let violations = violations(&report);
    assert!(
        violations
            .iter()
            .any(|(check, detail)| *check == "not_terminal" && detail.contains("withdrawals")),
        "{violations:#?}"
    );
    assert!(
        report["deploy"]["planted"]
            .as_str()
            .unwrap()
            .ends_with(".sql")
    );
}
