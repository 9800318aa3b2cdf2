//! What deliver-webhook sends, verified by the ecosystem's own libraries — the Standard
//! Webhooks reference library (`standardwebhooks`) and Svix's (`svix`), in Python — not by
//! paybus's code: real deliveries to a real HTTP server, during a secret rotation (a verifier
//! with the old `whsec_` secret and one with the new both accept the same delivery) and after
//! its overlap (the old one refuses).
//!
//! The libraries are installed by `infra/browser/install.sh` into `.local/venv`; without them
//! the test is skipped with a message, unless `PAYBUS_REQUIRE_PYTHON_TESTS` is set (then it
//! fails), like the console's browser test.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{path::PathBuf, process::Command, time::Duration};

use paybus_bus::{Context, Envelope, Handler, Outcome};
use paybus_deliver_webhook::{DeliverWebhook, WebhookConfig};
use paybus_partners::{notifications::NotificationCreated, webhook_secrets};
use paybus_testkit::{
    TestEnv,
    partners::{notification, partner_with_key},
    sealer,
};
use serde_json::{Value, json};
use wiremock::{Mock, MockServer, Request, ResponseTemplate, matchers::method};

/// The Python of `.local/venv` (or `PAYBUS_TEST_PYTHON`), or why it is missing: missing fails
/// the test when `PAYBUS_REQUIRE_PYTHON_TESTS` is set and skips it otherwise (the pattern of
/// `cli/tests/api_process`).
fn python_tool(variable: &str, venv_name: &str) -> Option<PathBuf> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".local/venv/bin").join(venv_name));
    let has_libraries = path.exists()
        && Command::new(&path)
            .args(["-c", "import standardwebhooks, svix"])
            .output()
            .is_ok_and(|output| output.status.success());
    if has_libraries {
        return Some(path);
    }
    let message = format!(
        "{} with standardwebhooks and svix is missing: run infra/browser/install.sh \
         (infra/test.sh does)",
        path.display()
    );
    if std::env::var_os("PAYBUS_REQUIRE_PYTHON_TESTS").is_some() {
        panic!("{message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}

/// A received request as the script reads it, with the secrets that must accept and refuse it.
fn delivery(request: &Request, accept: &[&str], reject: &[&str]) -> Value {
    let headers: serde_json::Map<String, Value> = request
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                Value::from(value.to_str().unwrap_or_default()),
            )
        })
        .collect();
    json!({
        "body": String::from_utf8(request.body.clone()).unwrap(),
        "headers": headers,
        "accept": accept,
        "reject": reject,
    })
}

#[tokio::test]
async fn the_reference_libraries_verify_deliveries_with_the_old_and_the_new_secret_during_a_rotation()
 {
    let Some(python) = python_tool("PAYBUS_TEST_PYTHON", "python") else {
        return;
    };
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let (old_key, old) = webhook_secrets::generate().unwrap();
    let (_, unrelated) = webhook_secrets::generate().unwrap();
    let partner_id = partner_with_key(&env.db, "acme", Some(&server.uri()), &old_key).await;
    let mut conn = env.db.acquire().await.unwrap();
    let new = webhook_secrets::rotate(
        &mut conn,
        &sealer(),
        partner_id,
        Duration::from_secs(24 * 3600),
        &paybus_testkit::person("ops"),
    )
    .await
    .unwrap();
    let handler = DeliverWebhook::new(WebhookConfig::default(), sealer()).unwrap();
    let ctx = Context {
        db: &services.outbox,
        attempt: 1,
    };
    let during = notification(&env.db, partner_id, 1).await;
    let outcome = handler
        .handle(
            Envelope::new(NotificationCreated {
                notification_id: during,
            }),
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Done);
    // The overlap is over: only the new secret signs.
    sqlx::query(
        "UPDATE partner_webhook_secrets SET expires_at = NOW(6) - INTERVAL 1 SECOND \
         WHERE partner_id = ? AND expires_at IS NOT NULL",
    )
    .bind(partner_id)
    .execute(&env.db)
    .await
    .unwrap();
    let after = notification(&env.db, partner_id, 2).await;
    let outcome = handler
        .handle(
            Envelope::new(NotificationCreated {
                notification_id: after,
            }),
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Done);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);

    let deliveries = json!([
        delivery(
            &requests[0],
            &[old.expose(), new.expose()],
            &[unrelated.expose()]
        ),
        delivery(
            &requests[1],
            &[new.expose()],
            &[old.expose(), unrelated.expose()]
        ),
    ]);
    let file = std::env::temp_dir().join(format!(
        "paybus-standard-webhooks-{during}-{}.json",
        std::process::id()
    ));
    std::fs::write(&file, deliveries.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/standard_webhooks.py");
    let output = Command::new(python)
        .arg(script)
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the libraries did not verify as expected:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // 2 libraries × (3 secrets for the first delivery + 3 for the second).
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with(": ok")).count(),
        12,
        "{stdout}"
    );
}
