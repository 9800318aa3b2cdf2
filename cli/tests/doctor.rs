//! `paybus doctor` run as a real process against the real services, and against dead ports.

use crate::api_process;

use std::{net::TcpListener, process::Output};

use api_process::{output_of, paybus};
use paybus_testkit::TestEnv;

/// A loopback port with nothing listening on it.
fn dead_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn doctor_passes_when_both_services_answer() {
    let env = TestEnv::new().await;
    let output = output_of(paybus(&env).args(["doctor"]));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", stderr(&output));
    assert!(stdout.contains("database: ok"), "{stdout}");
    assert!(stdout.contains("broker: ok"), "{stdout}");
}

#[tokio::test]
async fn doctor_fails_with_one_line_when_the_broker_is_down() {
    let env = TestEnv::new().await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", dead_port());
    let output = output_of(paybus(&env).env("PAYBUS_AMQP_URL", url).args(["doctor"]));
    assert!(!output.status.success());
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("broker: FAILED: "), "{err}");
    assert!(
        err.contains("Connection refused") || err.contains("refused"),
        "{err}"
    );
    assert!(!err.contains("guest:guest"), "credentials leaked: {err}");
}

#[tokio::test]
async fn doctor_fails_with_one_line_when_the_database_is_down() {
    let env = TestEnv::new().await;
    let url = format!("mysql://root:secret@127.0.0.1:{}/paybus", dead_port());
    let output = output_of(
        paybus(&env)
            .env("PAYBUS_DATABASE_URL", url)
            .args(["doctor"]),
    );
    assert!(!output.status.success());
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("database: FAILED: "), "{err}");
    assert!(
        err.contains("refused"),
        "the real reason, not a timeout: {err}"
    );
    assert!(!err.contains("secret"), "credentials leaked: {err}");
}

#[tokio::test]
async fn doctor_reports_pending_migrations_and_migrate_fixes_them() {
    let env = TestEnv::unmigrated().await;
    let output = output_of(paybus(&env).args(["doctor"]));
    assert!(!output.status.success());
    assert!(stderr(&output).contains("pending"), "{}", stderr(&output));

    let migrate = output_of(paybus(&env).args(["migrate"]));
    assert!(migrate.status.success(), "{}", stderr(&migrate));
    assert!(output_of(paybus(&env).args(["doctor"])).status.success());
}

#[tokio::test]
async fn a_malformed_setting_names_the_variable() {
    let env = TestEnv::new().await;
    let output = output_of(paybus(&env).env("PAYBUS_PREFETCH", "lots").args(["doctor"]));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("PAYBUS_PREFETCH"),
        "{}",
        stderr(&output)
    );
}
