//! A broker that blocks publishers (a real resource alarm on a RabbitMQ node of the test's
//! own, raised and cleared with `rabbitmqctl`): publishes on the blocked link fail within their
//! bounds naming the alarm, and a replacement connection starts unblocked.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::time::{Duration, Instant};

use paybus_canary::{Canary, Ping};
use paybus_lab::services::PrivateBroker;
use paybus_platform::{
    bus::{Envelope, Handler, OutgoingMessage},
    testing::{TestEnv, eventually, services_on},
};

/// What RabbitMQ 3.10 says when a memory alarm blocks a connection.
const MEMORY_ALARM: &str = "low on memory";

/// A memory alarm at once: the node's whole memory is over a watermark this low.
fn raise_memory_alarm(broker: &PrivateBroker) {
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&["set_vm_memory_high_watermark", "0.000001"]);
    });
}

/// RabbitMQ's default watermark: the alarm clears.
fn clear_memory_alarm(broker: &PrivateBroker) {
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]);
    });
}

fn ping(ping_id: u64) -> OutgoingMessage {
    Envelope::new(Ping { ping_id }).to_outgoing().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_link_fails_publishes_naming_the_alarm_and_its_replacement_starts_unblocked() {
    let env = TestEnv::new().await;
    let broker = tokio::task::spawn_blocking(PrivateBroker::start)
        .await
        .unwrap();
    let mut settings = env.settings.clone();
    settings.broker.url = broker.url.clone();
    let services = services_on(&settings, &[Canary::queue()]).await;
    let publisher = services.publisher();
    let link = publisher.link().clone();

    raise_memory_alarm(&broker);
    assert_eq!(link.blocked(), None, "told only once it publishes");

    // A batch into the alarm: the broker blocks the connection at its first message, and lapin
    // sends nothing more; every publish ends within its bounds (10 s to send, 10 s to be
    // confirmed), naming the alarm.
    let batch: Vec<OutgoingMessage> = (1..=200).map(ping).collect();
    let started = Instant::now();
    let results = tokio::time::timeout(Duration::from_secs(40), publisher.publish_events(&batch))
        .await
        .expect("a batch published into a blocking broker ends within its bounds");
    eprintln!(
        "a batch of 200 into the alarm ended in {:?}",
        started.elapsed()
    );
    for result in &results {
        let error = result
            .as_ref()
            .expect_err("nothing is confirmed while blocked");
        assert!(
            error
                .to_string()
                .contains(&format!("blocks this connection ({MEMORY_ALARM})")),
            "{error}"
        );
    }
    assert_eq!(link.blocked().as_deref(), Some(MEMORY_ALARM));

    // Once the link knows, a publish fails at once.
    let started = Instant::now();
    let refused = publisher.publish_event(&ping(201)).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        refused.to_string(),
        format!(
            "not sent: the broker blocks this connection ({MEMORY_ALARM}) until its resource alarm clears"
        )
    );

    // The broker drops the blocked connection; the link's replacement has been told nothing
    // (the alarm holds) until it publishes.
    let mut generation = link.generation();
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&[
            "close_all_connections",
            "the test replaces the blocked connection",
        ]);
    });
    tokio::time::timeout(Duration::from_secs(30), generation.changed())
        .await
        .expect("the link replaces the dropped connection within 30 s")
        .unwrap();
    assert_eq!(link.blocked(), None, "a new connection starts unblocked");
    let into_the_alarm = publisher.publish_event(&ping(202)).await.unwrap_err();
    assert!(
        into_the_alarm
            .to_string()
            .contains(&format!("it blocks this connection ({MEMORY_ALARM})")),
        "{into_the_alarm}"
    );
    assert_eq!(link.blocked().as_deref(), Some(MEMORY_ALARM));

    clear_memory_alarm(&broker);
    let unblocked = eventually(Duration::from_secs(10), || async {
        link.blocked().is_none()
    })
    .await;
    assert!(unblocked, "still blocked: {:?}", link.blocked());
    publisher
        .publish_event(&ping(203))
        .await
        .expect("published once the alarm cleared");
}
