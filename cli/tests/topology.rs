//! The topology declared by code and the shipped definitions file are the same thing.

use crate::api_process;

use api_process::{output_of, paybus};
use paybus_testkit::TestEnv;

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
    let output = output_of(paybus(&env).args(["topology", "--definitions"]));
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
    let output = output_of(paybus(&env).args(["topology", "--definitions", "--vhost", &vhost]));
    let definitions: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    env.import_definitions(&definitions).await;

    // Any argument that differed would fail with PRECONDITION_FAILED.
    for _ in 0..2 {
        let declare = output_of(paybus(&env).args(["topology"]));
        assert!(
            declare.status.success(),
            "{}",
            String::from_utf8_lossy(&declare.stderr)
        );
    }
}

#[tokio::test]
async fn a_sharded_layout_declared_over_its_imported_definitions_is_idempotent() {
    // The consistent-hash exchange, its exchange-to-exchange binding and the shard queues are
    // the same in the definitions document and in the code.
    let env = TestEnv::new().await;
    let vhost = env.vhost.clone();
    let layout = "confirm-withdrawal=4,grant-bonus=2";
    let output = output_of(paybus(&env).env("PAYBUS_SHARDS", layout).args([
        "topology",
        "--definitions",
        "--vhost",
        &vhost,
    ]));
    let definitions: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    env.import_definitions(&definitions).await;

    let declare = output_of(paybus(&env).env("PAYBUS_SHARDS", layout).args(["topology"]));

    assert!(
        declare.status.success(),
        "{}",
        String::from_utf8_lossy(&declare.stderr)
    );
    let exchanges: Vec<&str> = definitions["exchanges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "x-consistent-hash")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        exchanges,
        [
            "paybus.confirm-withdrawal.shards",
            "paybus.grant-bonus.shards"
        ]
    );
    let unknown = output_of(
        paybus(&env)
            .env("PAYBUS_SHARDS", "confirm-withdrawl=4")
            .args(["topology"]),
    );
    assert!(!unknown.status.success(), "a misspelt function is refused");
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("PAYBUS_SHARDS"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_shard_count_retires_the_old_queue_and_drains_it_onto_the_shards() {
    let env = TestEnv::new().await;
    assert!(output_of(paybus(&env).args(["topology"])).status.success());
    let services = paybus_testkit::services_on(&env.settings, &[]).await;
    for ping_id in 1..=3 {
        let message = paybus_bus::Envelope::new(paybus_canary::Ping { ping_id })
            .to_outgoing()
            .unwrap();
        services.publisher().publish_event(&message).await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let listed = output_of(paybus(&env).env("PAYBUS_SHARDS", "canary=2").args([
        "topology",
        "--previous-shards",
        "",
    ]));
    let drained = output_of(paybus(&env).env("PAYBUS_SHARDS", "canary=2").args([
        "topology",
        "--previous-shards",
        "",
        "--drain-retired",
    ]));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed.contains("retired paybus.canary (an earlier shard layout's; unbound): 3 message(s)"),
        "{listed}"
    );
    let drained = String::from_utf8_lossy(&drained.stdout).into_owned();
    assert!(
        drained.contains("retired paybus.canary: 3 message(s) moved back into paybus.events"),
        "{drained}"
    );
    let channel = services.connection().create_channel().await.unwrap();
    let mut on_shards = 0;
    for queue in ["paybus.canary.s0", "paybus.canary.s1"] {
        on_shards += paybus_testkit::queue_depth(&channel, queue).await;
    }
    assert_eq!(on_shards, 3);
    assert_eq!(
        paybus_testkit::queue_depth(&channel, "paybus.canary").await,
        0
    );
}
