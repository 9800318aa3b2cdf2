//! The real `canary` binary in Lambda mode, against a local Lambda Runtime API (the HTTP
//! interface Lambda gives a custom runtime) and the test's own database and vhost.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::time::Duration;

use paybus_bus::{Envelope, Handler};
use paybus_canary::{Canary, Ping};
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    queue_depth,
};

const PINGS_EVENT: &str = include_str!("fixtures/canary-pings-event.json");

async fn ping(env: &TestEnv, id: u64) -> (String, u32) {
    sqlx::query_as("SELECT status, pongs FROM canary_pings WHERE id = ?")
        .bind(id)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_binary_answers_lambda_invocations_and_pongs_each_ping_once() {
    let env = TestEnv::new().await;
    for expected in 1..=3u64 {
        let id = sqlx::query("INSERT INTO canary_pings () VALUES ()")
            .execute(&env.db)
            .await
            .unwrap()
            .last_insert_id();
        assert_eq!(id, expected, "the fixture names pings 1 and 2");
    }
    // The deployment declares the topology; the Lambda does not.
    let services = env.services(&[Canary::queue()]).await;
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_canary"), &api, env.env_vars());

    let first_next = api.next_call(Duration::from_secs(30)).await;
    println!(
        "cold start (spawn to first GET /next): {:?}",
        first_next.duration_since(lambda.spawned)
    );
    // The crate's own fixture (real Amazon MQ properties), then one built here: ping 3, its
    // duplicate in the same batch, and a body that is not base64.
    let fixture = lambda.invoke(&mut api, PINGS_EVENT).await.response();
    let built = MqEvent::new("paybus.canary")
        .envelope(&Envelope::new(Ping { ping_id: 3 }))
        .repeat_last()
        .raw("not-base64", "%%% not base64 %%%");
    let mixed = lambda.invoke(&mut api, built.json()).await.response();

    assert_eq!(
        fixture,
        serde_json::json!({"processed": 2, "acked": 2, "dead_lettered": 0})
    );
    assert_eq!(
        mixed,
        serde_json::json!({"processed": 3, "acked": 2, "dead_lettered": 1})
    );
    for id in 1..=3u64 {
        assert_eq!(ping(&env, id).await, ("PONGED".to_owned(), 1), "ping {id}");
    }
    let channel = services.connection().create_channel().await.unwrap();
    assert_eq!(
        queue_depth(&channel, &Canary::queue().dead_letter_queue()).await,
        1
    );
    // It went back for the next event and waits there, alive.
    api.next_call(Duration::from_secs(10)).await;
    assert!(
        lambda.is_running(),
        "the runtime keeps running between invocations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_fails_the_invocation_and_the_replay_pongs_each_ping_once() {
    let env = TestEnv::new().await;
    let _services = env.services(&[Canary::queue()]).await;
    for _ in 0..2 {
        sqlx::query("INSERT INTO canary_pings () VALUES ()")
            .execute(&env.db)
            .await
            .unwrap();
    }
    let mut api = RuntimeApi::start().await;
    let (mut lambda, database) =
        LambdaProcess::spawn_behind_relay(env!("CARGO_BIN_EXE_canary"), &mut api, &env).await;
    let batch = MqEvent::new("paybus.canary")
        .envelope(&Envelope::new(Ping { ping_id: 1 }))
        .envelope(&Envelope::new(Ping { ping_id: 2 }))
        .repeat_last();

    let (_, replayed) = lambda
        .invoke_during_and_after_outage(&mut api, &database, &batch.json())
        .await;

    assert_eq!(
        replayed,
        serde_json::json!({"processed": 3, "acked": 3, "dead_lettered": 0})
    );
    for id in 1..=2u64 {
        assert_eq!(ping(&env, id).await, ("PONGED".to_owned(), 1), "ping {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_reported_to_lambda_as_the_init_error() {
    let env = TestEnv::new().await;
    let vars = env.env_vars_with_database_unreachable();
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_canary"), &api, vars);

    let (from, answer) = api.answer(Duration::from_secs(30)).await;
    let status = lambda.wait().await;

    assert_eq!(from, "init");
    let paybus_testkit::lambda::Answer::InitError(error) = answer else {
        panic!("an init error, not {answer:?}");
    };
    assert_eq!(error["errorType"], "paybus.DatabaseUnreachable", "{error}");
    let message = error["errorMessage"].as_str().unwrap();
    assert!(message.contains("cannot reach the database"), "{message}");
    assert!(
        !message.contains(paybus_testkit::UNREACHABLE_DATABASE_PASSWORD),
        "no password in Lambda's error: {message}"
    );
    assert_eq!(status, Some(1));
    assert!(api.no_answer(), "it never asked for an event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_another_functions_queue_is_refused_and_nothing_is_processed() {
    // A trigger wired to the wrong queue: the messages are of the right type, and must still
    // not be processed (nor acknowledged) by this function.
    let env = TestEnv::new().await;
    sqlx::query("INSERT INTO canary_pings () VALUES ()")
        .execute(&env.db)
        .await
        .unwrap();
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_canary"), &api, env.env_vars());
    let ping = Envelope::new(Ping { ping_id: 1 });

    let refused = lambda
        .invoke(
            &mut api,
            MqEvent::new("paybus.confirm-withdrawal")
                .envelope(&ping)
                .json(),
        )
        .await
        .error();
    let before = ping_state(&env).await;
    let own = lambda
        .invoke(
            &mut api,
            MqEvent::new("paybus.canary").envelope(&ping).json(),
        )
        .await
        .response();

    assert_eq!(refused["errorType"], "paybus.WrongQueue", "{refused}");
    let message = refused["errorMessage"].as_str().unwrap();
    assert!(
        message.contains("paybus.confirm-withdrawal::/"),
        "{message}"
    );
    assert!(message.contains("reads only paybus.canary"), "{message}");
    assert_eq!(
        before,
        ("PENDING".to_owned(), 0),
        "the refused event did nothing"
    );
    assert_eq!(own["processed"], 1);
    assert_eq!(ping_state(&env).await, ("PONGED".to_owned(), 1));
}

async fn ping_state(env: &TestEnv) -> (String, u32) {
    ping(env, 1).await
}
