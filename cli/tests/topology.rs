//! The topology declared by code and the shipped definitions file are the same thing.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_platform::testing::TestEnv;

fn paybus(env: &TestEnv, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_paybus"))
        .args(args)
        .envs(env.env_vars())
        .output()
        .expect("run paybus")
}

fn shipped_definitions() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../infra/rabbitmq/definitions.json"
    );
    let text = std::fs::read_to_string(path).expect("infra/rabbitmq/definitions.json exists");
    serde_json::from_str(&text).expect("definitions.json is JSON")
}

#[tokio::test]
async fn the_shipped_definitions_file_matches_the_code() {
    let env = TestEnv::new().await;
    let output = paybus(&env, &["topology", "--definitions"]);
    assert!(output.status.success());
    let generated: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        generated,
        shipped_definitions(),
        "regenerate with: cargo run -q -p paybus -- topology --definitions > infra/rabbitmq/definitions.json"
    );
}

#[tokio::test]
async fn declaring_over_imported_definitions_and_again_is_idempotent() {
    let env = TestEnv::new().await;
    let vhost = env.vhost.clone();
    let output = paybus(&env, &["topology", "--definitions", "--vhost", &vhost]);
    let definitions: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    env.import_definitions(&definitions).await;

    // Any argument that differed would fail with PRECONDITION_FAILED.
    for _ in 0..2 {
        let declare = paybus(&env, &["topology"]);
        assert!(
            declare.status.success(),
            "{}",
            String::from_utf8_lossy(&declare.stderr)
        );
    }
}
