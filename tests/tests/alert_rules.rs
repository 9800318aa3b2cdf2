//! The shipped alert rules (`infra/prometheus/alerts.yml`) checked by Prometheus's own tool:
//! `promtool check rules` (they load) and `promtool test rules` (each fires on the series that
//! should fire it and stays silent otherwise, `alerts.test.yml`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/prometheus")
}

/// promtool, or `None` (the test then skips, unless the suite requires it).
fn promtool() -> Option<PathBuf> {
    let promtool = std::env::var_os("PAYBUS_TEST_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("promtool"));
    let found = Command::new(&promtool).arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var_os("PAYBUS_REQUIRE_PROMTOOL").is_none(),
            "promtool is missing: infra/prometheus/install.sh installs it"
        );
        eprintln!(
            "skipped: no promtool (infra/prometheus/install.sh installs Debian's prometheus)"
        );
        return None;
    }
    Some(promtool)
}

fn promtool_says(promtool: &Path, args: &[&str]) -> String {
    let output = Command::new(promtool)
        .args(args)
        .current_dir(rules_dir())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{said}");
    said
}

#[test]
fn the_alert_rules_load_and_each_fires_only_when_it_should() {
    let Some(promtool) = promtool() else {
        return;
    };
    let checked = promtool_says(&promtool, &["check", "rules", "alerts.yml"]);
    let rules = std::fs::read_to_string(rules_dir().join("alerts.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .collect();
    assert!(
        checked.contains(&format!("{} rules found", alerts.len())),
        "{checked}"
    );
    promtool_says(&promtool, &["test", "rules", "alerts.test.yml"]);

    // Every rule has its unit test (promtool passes a rule no test names).
    let tests = std::fs::read_to_string(rules_dir().join("alerts.test.yml")).unwrap();
    let untested: Vec<&&str> = alerts
        .iter()
        .filter(|alert| !tests.contains(&format!("alertname: {alert}\n")))
        .collect();
    assert!(
        untested.is_empty(),
        "alerts without a unit test: {untested:?}"
    );
}
