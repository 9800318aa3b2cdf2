//! The Lambda transport on Amazon MQ events: `handle_event` with the canary handler against
//! the test's own MariaDB database and RabbitMQ vhost.

use std::collections::HashMap;

use aws_lambda_events::event::rabbitmq::RabbitMqEvent;
use base64::Engine;
use lapin::{Channel, options::BasicGetOptions};
use paybus_bus::{
    Envelope, Handler, Message, Services,
    dead_letter::{H_ATTEMPTS, H_FUNCTION, H_REASON, H_ROUTING_KEY},
    headers::{header_integer, header_text},
};
use paybus_canary::{Canary, Ping};
use paybus_runtime::lambda::{BatchSummary, handle_event};
use paybus_testkit::{TestEnv, services_on};

const PINGS_EVENT: &str = include_str!("fixtures/canary-pings-event.json");
const BAD_MESSAGES_EVENT: &str = include_str!("fixtures/canary-bad-messages-event.json");

fn event(json: &str) -> RabbitMqEvent {
    serde_json::from_str(json).expect("the fixture is a RabbitMqEvent")
}

/// Inserts `n` pending pings; a fresh database numbers them 1..=n, as the fixtures expect.
async fn create_pings(env: &TestEnv, n: u64) {
    for expected in 1..=n {
        let id = sqlx::query("INSERT INTO canary_pings () VALUES ()")
            .execute(&env.db)
            .await
            .expect("insert a ping")
            .last_insert_id();
        assert_eq!(id, expected, "the fixtures name pings 1..={n}");
    }
}

async fn ping(env: &TestEnv, id: u64) -> (String, u32) {
    sqlx::query_as("SELECT status, pongs FROM canary_pings WHERE id = ?")
        .bind(id)
        .fetch_one(&env.db)
        .await
        .expect("read the ping")
}

/// Takes every message of the canary's DLQ.
async fn drain_dlq(channel: &Channel) -> Vec<lapin::message::Delivery> {
    let queue = Canary::queue().dead_letter_queue();
    let mut out = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get on the DLQ")
    {
        out.push(message.delivery);
    }
    out
}

/// The fixtures' bodies are exactly what `Envelope::new(Ping { .. })` serialises to.
#[test]
fn fixture_bodies_are_real_canary_envelopes() {
    let event = event(PINGS_EVENT);
    let messages = &event.messages_by_queue["paybus.canary::/"];
    assert_eq!(messages.len(), 2);
    for (i, message) in messages.iter().enumerate() {
        let body = base64::engine::general_purpose::STANDARD
            .decode(message.data.as_deref().unwrap())
            .unwrap();
        let envelope: Envelope<Ping> = serde_json::from_slice(&body).unwrap();
        assert_eq!(envelope.kind, Ping::TYPE);
        assert_eq!(
            envelope.correlation_id, envelope.id,
            "a new flow, as Envelope::new makes"
        );
        assert_eq!(envelope.data.ping_id, i as u64 + 1);
        assert_eq!(
            serde_json::to_vec(&envelope).unwrap(),
            body,
            "byte for byte"
        );
        assert_eq!(
            message.basic_properties.message_id.as_deref(),
            Some(envelope.id.to_string().as_str())
        );
        // The same shape as a real envelope made now.
        let fresh: serde_json::Value =
            serde_json::to_value(Envelope::new(Ping { ping_id: 1 })).unwrap();
        let fixture: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&fixture), keys(&fresh));
    }
}

#[tokio::test]
async fn an_event_pongs_each_ping_once_and_a_replayed_batch_changes_nothing() {
    let env = TestEnv::new().await;
    create_pings(&env, 2).await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;

    let summary = handle_event(&Canary, &services, event(PINGS_EVENT))
        .await
        .expect("the batch succeeds");
    assert_eq!(
        summary,
        BatchSummary {
            processed: 2,
            acked: 2,
            dead_lettered: 0
        }
    );
    assert_eq!(ping(&env, 1).await, ("PONGED".to_owned(), 1));
    assert_eq!(ping(&env, 2).await, ("PONGED".to_owned(), 1));

    // Amazon MQ redelivers a whole batch after an error: the second run is all skips.
    let again = handle_event(&Canary, &services, event(PINGS_EVENT))
        .await
        .expect("the replayed batch succeeds");
    assert_eq!(again, summary);
    assert_eq!(ping(&env, 1).await, ("PONGED".to_owned(), 1));
    assert_eq!(ping(&env, 2).await, ("PONGED".to_owned(), 1));

    let channel = services.connection().create_channel().await.unwrap();
    assert!(drain_dlq(&channel).await.is_empty(), "no dead letters");
}

#[tokio::test]
async fn bad_messages_are_dead_lettered_with_their_reason_and_the_batch_succeeds() {
    let env = TestEnv::new().await;
    create_pings(&env, 1).await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;

    let summary = handle_event(&Canary, &services, event(BAD_MESSAGES_EVENT))
        .await
        .expect("bad messages never fail the batch");
    assert_eq!(
        summary,
        BatchSummary {
            processed: 4,
            acked: 0,
            dead_lettered: 4
        }
    );
    // `other.thing` names ping 1 but is not the canary's type: nothing touched it.
    assert_eq!(ping(&env, 1).await, ("PENDING".to_owned(), 0));

    let channel = services.connection().create_channel().await.unwrap();
    let dead: HashMap<String, lapin::message::Delivery> = drain_dlq(&channel)
        .await
        .into_iter()
        .map(|d| (d.properties.message_id().as_ref().unwrap().to_string(), d))
        .collect();
    assert_eq!(
        dead.len(),
        4,
        "one dead letter per bad message: {:?}",
        dead.keys()
    );
    let header = |id: &str, name: &str| header_text(dead[id].properties.headers().as_ref(), name);
    let reason = |id: &str| header(id, H_REASON).unwrap_or_default();

    assert_eq!(reason("bad-base64"), "malformed");
    assert_eq!(reason("not-an-envelope"), "malformed");
    assert_eq!(reason("019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d03"), "failed");
    assert_eq!(
        reason("019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d04"),
        "unknown_type"
    );
    for id in dead.keys() {
        assert_eq!(header(id, H_FUNCTION).as_deref(), Some("canary"));
    }

    // The event's headers survive into the dead letter ({"bytes": ..} strings, numbers), and
    // its x-delivery-count (2 earlier deliveries) makes this the third attempt.
    let bad = &dead["bad-base64"];
    assert_eq!(
        header_text(bad.properties.headers().as_ref(), "x-trace").as_deref(),
        Some("abc")
    );
    assert_eq!(
        header_integer(bad.properties.headers().as_ref(), H_ATTEMPTS),
        Some(3)
    );
    assert_eq!(
        bad.data, b"%%% this is not base64 %%%",
        "the raw data, for ops to see"
    );
    assert_eq!(dead["not-an-envelope"].data, b"hello, I am not an envelope");

    // The missing ping's message had no AMQP type: its routing key came from the envelope,
    // and the dead letter carries the decoded body.
    let missing = &dead["019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d03"];
    assert_eq!(
        header("019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d03", H_ROUTING_KEY).as_deref(),
        Some("canary.ping")
    );
    let envelope: Envelope<Ping> = serde_json::from_slice(&missing.data).unwrap();
    assert_eq!(envelope.data.ping_id, 999_999);
    assert_eq!(
        header("019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d04", H_ROUTING_KEY).as_deref(),
        Some("other.thing")
    );
}

#[tokio::test]
async fn an_infrastructure_fault_fails_the_batch_after_settling_the_rest() {
    let env = TestEnv::new().await;
    create_pings(&env, 2).await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    // The database becomes unreachable for this process.
    services.pool.close().await;

    let mut mixed = event(PINGS_EVENT);
    let bad = event(BAD_MESSAGES_EVENT);
    let queue = mixed.messages_by_queue.get_mut("paybus.canary::/").unwrap();
    queue.push(bad.messages_by_queue["paybus.canary::/"][0].clone()); // bad-base64

    let failed = handle_event(&Canary, &services, mixed.clone())
        .await
        .expect_err("pings that cannot reach the database fail the batch");
    let error = failed.batch().expect("a batch error");
    assert_eq!(error.faults.len(), 2, "{error}");
    assert_eq!(
        error.summary,
        BatchSummary {
            processed: 1,
            acked: 0,
            dead_lettered: 1
        },
        "the malformed message was still dead-lettered"
    );
    assert!(
        error.faults.iter().all(|f| f.queue == "paybus.canary::/"),
        "{error}"
    );
    assert_eq!(
        error.faults[0].message_id.as_deref(),
        Some("019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d01")
    );
    assert_eq!(ping(&env, 1).await, ("PENDING".to_owned(), 0));

    // Amazon MQ retries the batch; with the database back, it succeeds and pongs once.
    let services = Services::connect(env.settings.clone()).await.unwrap();
    let summary = handle_event(&Canary, &services, mixed).await.unwrap();
    assert_eq!(
        summary,
        BatchSummary {
            processed: 3,
            acked: 2,
            dead_lettered: 1
        }
    );
    assert_eq!(ping(&env, 1).await, ("PONGED".to_owned(), 1));
    assert_eq!(ping(&env, 2).await, ("PONGED".to_owned(), 1));
}

#[tokio::test]
async fn an_unconfirmed_dead_letter_fails_the_batch() {
    let env = TestEnv::new().await;
    // No topology: `paybus.dlx` does not exist, so the dead letter cannot be confirmed.
    let services = Services::connect(env.settings.clone()).await.unwrap();
    let failed = handle_event(&Canary, &services, event(BAD_MESSAGES_EVENT))
        .await
        .expect_err("a dead letter the broker did not take is an infrastructure fault");
    let error = failed.batch().expect("a batch error");
    assert_eq!(error.faults.len(), 4, "{error}");
    assert!(
        error.faults[0].error.contains("dead letter not confirmed"),
        "{error}"
    );
}
