//! Schemathesis (PyPI) fuzzes the real API binary from the document it serves
//! (`/openapi.json`), with a valid ADMIN token, then its partner routes again with a partner's
//! API key: no answer may be a 5xx, have a status the
//! document does not list, or break the documented schema (client mistakes are 4xx with the
//! JSON error body). A short, seeded run here; `PAYBUS_SCHEMATHESIS_EXAMPLES` raises it (the
//! README gives a longer run's figures). The report lands in `.local/test-output/schemathesis/`.

use crate::api_process;

use std::process::Command;

use api_process::{ApiProcess, output_dir, python_tool};
use paybus_testkit::TestEnv;

#[tokio::test]
async fn fuzzing_the_served_document_finds_no_server_error_and_no_schema_break() {
    let Some(schemathesis) = python_tool("PAYBUS_TEST_SCHEMATHESIS", "schemathesis") else {
        return;
    };
    let env = TestEnv::new().await;
    let api = ApiProcess::start(&env).await;
    let token = api.token(&["ADMIN"]);
    let examples = std::env::var("PAYBUS_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "8".into());

    let stdout = fuzz(
        &schemathesis,
        &api.base_url,
        &token,
        &examples,
        &[],
        "schemathesis",
    );
    // It really ran: every operation was exercised, with a real number of cases.
    let tested = number_after(&stdout, "Tested: ");
    let cases = number_after(&stdout, "Test cases:\n  ");
    assert!(
        tested >= 30 && cases >= 300,
        "tested {tested} operations, {cases} cases:\n{stdout}"
    );

    // The partner API again, with a partner's own key (the admin token above only gets 401s
    // there).
    let http = reqwest::Client::new();
    let partner: serde_json::Value = http
        .post(format!("{}/v1/admin/partners", api.base_url))
        .bearer_auth(&token)
        .json(&serde_json::json!({"name": "fuzzed", "webhook_secret": "fuzzed-partner-secret-01"}))
        .send()
        .await
        .expect("create a partner")
        .json()
        .await
        .expect("its id");
    let issued: serde_json::Value = http
        .post(format!(
            "{}/v1/admin/partners/{}/api-keys",
            api.base_url, partner["id"]
        ))
        .bearer_auth(&token)
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("create a key")
        .json()
        .await
        .expect("the key");
    let key = issued["key"].as_str().expect("a key");
    let stdout = fuzz(
        &schemathesis,
        &api.base_url,
        key,
        &examples,
        &["--include-path-regex", "^/v1/partner/"],
        "schemathesis-partner",
    );
    let tested = number_after(&stdout, "Tested: ");
    assert!(tested >= 7, "tested {tested} partner operations:\n{stdout}");
}

/// One seeded schemathesis run with `bearer`, its report kept under `report_name`; its output.
fn fuzz(
    schemathesis: &std::path::Path,
    base_url: &str,
    bearer: &str,
    examples: &str,
    filters: &[&str],
    report_name: &str,
) -> String {
    let report = output_dir(report_name);
    let output = Command::new(schemathesis)
        .arg("run")
        .arg(format!("{base_url}/openapi.json"))
        .args(["--url", base_url])
        .args(["--header", &format!("Authorization: Bearer {bearer}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_schema_conformance",
        ])
        .args(["--max-examples", examples])
        .args(["--seed", "12"])
        // No example database: a local run replayed what earlier runs found (in
        // `cli/.hypothesis`) and so tested other cases than CI's fresh clone.
        .args(["--generation-database", "none"])
        // One worker: CPython 3.11's `ast` is not thread-safe, and hypothesis parses sources
        // while describing strategies ("AST constructor recursion depth mismatch" with 2).
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(filters)
        .arg("--report")
        .arg("junit")
        .arg("--report-dir")
        .arg(&report)
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    std::fs::write(report.join("output.txt"), stdout.as_bytes()).expect("keep the output");
    assert!(
        output.status.success(),
        "schemathesis found problems:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn number_after(text: &str, label: &str) -> u64 {
    text.split_once(label)
        .map(|(_, rest)| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
}
