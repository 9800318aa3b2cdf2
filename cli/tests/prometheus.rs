//! The shipped alert rules in a real Prometheus (Debian's `prometheus`) scraping a real `paybus
//! run`: a confirmation the function must refuse becomes a dead letter, and Prometheus's own
//! API shows `PaybusDeadLettersWaiting` go from inactive to firing.

use crate::api_process;

use api_process::paybus;
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use paybus_config::signature;
use paybus_testkit::{TestEnv, free_port};
use serde_json::Value;

const SECRET: &str = "chain-monitor-secret-prom-0123";

/// A child process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The prometheus server, or `None` (the test then skips, unless the suite requires it).
fn prometheus() -> Option<PathBuf> {
    let prometheus = std::env::var_os("PAYBUS_TEST_PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("prometheus"));
    if Command::new(&prometheus).arg("--version").output().is_ok() {
        return Some(prometheus);
    }
    assert!(
        std::env::var_os("PAYBUS_REQUIRE_PROMTOOL").is_none(),
        "prometheus is missing: infra/prometheus/install.sh installs it"
    );
    eprintln!("skipped: no prometheus (infra/prometheus/install.sh installs Debian's)");
    None
}

/// The state Prometheus gives `alert` in its rule group (`inactive`, `pending`, `firing`),
/// once the rule has been evaluated at least once, and its alerts' labels.
async fn alert_state(client: &reqwest::Client, base: &str, alert: &str) -> Option<(String, Value)> {
    let rules: Value = client
        .get(format!("{base}/api/v1/rules?type=alert"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let rule = rules["data"]["groups"]
        .as_array()?
        .iter()
        .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
        .find(|rule| rule["name"] == alert)?;
    let evaluated = rule["lastEvaluation"]
        .as_str()
        .is_some_and(|at| !at.starts_with("0001-"));
    evaluated.then(|| {
        (
            rule["state"].as_str().unwrap_or("").to_owned(),
            rule["alerts"].clone(),
        )
    })
}

async fn wait_for_state(client: &reqwest::Client, base: &str, state: &str) -> Value {
    let started = Instant::now();
    loop {
        if let Some((now, alerts)) = alert_state(client, base, "PaybusDeadLettersWaiting").await
            && now == state
        {
            return alerts;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "PaybusDeadLettersWaiting never {state}: {:?}",
            alert_state(client, base, "PaybusDeadLettersWaiting").await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Prometheus's answer to `query` evaluated now.
async fn instant_query(client: &reqwest::Client, base: &str, query: &str) -> Value {
    let url = reqwest::Url::parse_with_params(&format!("{base}/api/v1/query"), [("query", query)]);
    client
        .get(url.unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_fires_the_shipped_alert_in_a_real_prometheus() {
    let Some(prometheus) = prometheus() else {
        return;
    };
    let env = TestEnv::new().await;
    let paybus_port = free_port();
    let _run = Running(
        paybus(&env)
            .arg("run")
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{paybus_port}"))
            .env("PAYBUS_CHAIN_MONITOR_SECRET", SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/prometheus/alerts.yml");
    let dir = std::env::temp_dir().join(format!("paybus-prometheus-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: paybus\n    static_configs:\n      - targets: ['127.0.0.1:{paybus_port}']\n",
            rules.canonicalize().unwrap().display()
        ),
    )
    .unwrap();
    let prometheus_port = free_port();
    let _prometheus = Running(
        Command::new(prometheus)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{prometheus_port}");

    // Nothing failed yet: evaluated, and inactive.
    wait_for_state(&client, &base, "inactive").await;

    // A confirmation of a withdrawal CONFIRMED under another tx: confirm-withdrawal refuses it
    // (an on-chain tx nobody expected) and dead-letters it.
    for sql in [
        "INSERT INTO partners (id, name) VALUES (7, 'p7')",
        "INSERT INTO withdrawals (id, partner_id, kind, status, currency, amount, to_address, tx_hash, confirmed_at) \
         VALUES (70, 7, 'NORMAL', 'CONFIRMED', 'USDT', 100, 'T-addr', '0xrecorded', NOW(6))",
    ] {
        sqlx::query(sql).execute(&env.db).await.unwrap();
    }
    let body = r#"{"withdrawal_id": 70, "tx_hash": "0xunexpected"}"#;
    let url = format!("http://127.0.0.1:{paybus_port}/v1/chain-monitor/withdrawal-confirmations");
    let started = Instant::now();
    let accepted = loop {
        let now = chrono::Utc::now().timestamp();
        let sent = client
            .post(&url)
            .header("content-type", "application/json")
            .header(
                signature::HEADER,
                signature::sign(SECRET.as_bytes(), now, body.as_bytes()),
            )
            .body(body)
            .send()
            .await;
        match sent {
            // Not listening yet, or listening and starting (503 until its services are up).
            Ok(answer) if answer.status() == 503 && started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(answer) => break answer.status().as_u16(),
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("paybus run did not come up: {error}"),
        }
    };
    assert_eq!(accepted, 202);

    let alerts = wait_for_state(&client, &base, "firing").await;
    let labels = &alerts[0]["labels"];
    assert_eq!(labels["function"], "confirm-withdrawal", "{alerts}");
    assert_eq!(labels["severity"], "warning", "{alerts}");
    let letters: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dead_letters WHERE status = 'NEW'")
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(letters, 1);

    // The build the scraped process runs, as Prometheus stored its OpenMetrics info series.
    let build = instant_query(&client, &base, "paybus_build_info").await;
    let labels = &build["data"]["result"][0]["metric"];
    assert_eq!(labels["version"], env!("CARGO_PKG_VERSION"), "{build}");
    assert_eq!(labels["commit"], paybus_testkit::head_commit(), "{build}");

    // The shipped Grafana dashboard: every query is PromQL this Prometheus accepts, and names
    // only series paybus serves (a typo would be valid PromQL and an empty panel forever).
    let served = client
        .get(format!("http://127.0.0.1:{paybus_port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra/grafana/paybus.json"),
        )
        .unwrap(),
    )
    .unwrap();
    // A counter appears once it has counted something; the documented table names them all.
    let documented = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    for query in &queries {
        let answer = instant_query(&client, &base, query).await;
        assert_eq!(answer["status"], "success", "{query}: {answer}");
        for series in query
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("paybus_"))
        {
            let family = series
                .trim_end_matches("_bucket")
                .trim_end_matches("_total");
            assert!(
                served.contains(family) || documented.contains(&format!("`{series}")),
                "the dashboard's {series} is neither served nor documented (in {query})"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A name no other run of this test uses at the same time.
fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
    )
}
