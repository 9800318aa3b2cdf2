//! Sharded function queues (`PAYBUS_SHARDS`) on the real broker and database: messages of one
//! entity meet on one shard through RabbitMQ's consistent-hash exchange, a sharded function
//! consumes every shard (locally one consumer per shard, in Lambda one trigger per shard) and
//! applies each message once, and a change of the shard count retires the old queues without
//! losing what they held.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use lapin::options::BasicGetOptions;
use paybus_bus::{Envelope, Handler, Services, topology};
use paybus_canary::{Canary, Ping};
use paybus_config::{Settings, Shards};
use paybus_runtime::{
    lambda::{BatchSummary, InvocationError, handle_event},
    runner::Runner,
};
use paybus_testkit::{TestEnv, eventually, lambda::MqEvent, queue_state, scalar, services_on};
use tokio_util::sync::CancellationToken;

use crate::outcome_counts::OutcomeCounts;

const SHARDS: u16 = 4;

fn sharded(env: &TestEnv, count: u16) -> Settings {
    let mut settings = env.settings.clone();
    settings.broker.shards = Shards::default().with(Canary::FUNCTION, count);
    settings
}

fn canary_queues(settings: &Settings) -> Vec<topology::FunctionQueue> {
    Canary::queue().queues_in(&settings.broker.shards)
}

async fn insert_pings(env: &TestEnv, n: usize) -> Vec<u64> {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(
            sqlx::query("INSERT INTO canary_pings () VALUES ()")
                .execute(&env.db)
                .await
                .unwrap()
                .last_insert_id(),
        );
    }
    ids
}

/// `copies` messages for each ping (each a message of its own, as a re-sent webhook is),
/// published to `paybus.events` with confirms.
async fn publish_pings(services: &Services, ids: &[u64], copies: usize) {
    let messages: Vec<_> = ids
        .iter()
        .flat_map(|&ping_id| {
            (0..copies).map(move |_| Envelope::new(Ping { ping_id }).to_outgoing().unwrap())
        })
        .collect();
    for result in services.publisher().publish_events(&messages).await {
        result.expect("the broker confirmed the publish");
    }
}

/// Every message in `queue`, taken (no ack needed).
async fn take_all(channel: &lapin::Channel, queue: &str) -> Vec<lapin::message::Delivery> {
    let mut taken = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        taken.push(message.delivery);
    }
    taken
}

/// Which shards the messages of each ping landed on, read off the shard queues.
async fn shards_of_each_ping(
    services: &Services,
    settings: &Settings,
) -> BTreeMap<u64, BTreeSet<u16>> {
    let channel = services.connection().create_channel().await.unwrap();
    let mut landed: BTreeMap<u64, BTreeSet<u16>> = BTreeMap::new();
    for queue in canary_queues(settings) {
        // Publisher confirms mean routed, not yet counted by a passive declare: wait a little.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for delivery in take_all(&channel, &queue.queue()).await {
            let envelope: Envelope<Ping> = serde_json::from_slice(&delivery.data).unwrap();
            landed
                .entry(envelope.data.ping_id)
                .or_default()
                .insert(queue.shard.index);
        }
    }
    landed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_message_of_one_entity_lands_on_one_shard_and_every_shard_gets_some() {
    let env = TestEnv::new().await;
    let settings = sharded(&env, SHARDS);
    let services = services_on(&settings, &canary_queues(&settings)).await;
    let ids: Vec<u64> = (1..=200).collect();

    publish_pings(&services, &ids, 3).await;
    let landed = shards_of_each_ping(&services, &settings).await;

    assert_eq!(landed.len(), ids.len(), "every ping arrived");
    let split: Vec<_> = landed.iter().filter(|(_, s)| s.len() > 1).collect();
    assert_eq!(
        split,
        Vec::<(&u64, &BTreeSet<u16>)>::new(),
        "copies on two shards"
    );
    let mut per_shard = BTreeMap::<u16, usize>::new();
    for shards in landed.values() {
        *per_shard.entry(*shards.iter().next().unwrap()).or_default() += 1;
    }
    eprintln!("pings per shard: {per_shard:?}");
    assert_eq!(per_shard.len(), usize::from(SHARDS), "{per_shard:?}");
    // The unsharded queue is not part of this layout.
    assert_eq!(queue_state(&services, "paybus.canary").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_shard_key_the_copies_of_one_entity_scatter() {
    // The control: messages whose envelope has no shard key hash on their message id, so the
    // three messages about one ping land on different shards. The key is what keeps them.
    let env = TestEnv::new().await;
    let settings = sharded(&env, SHARDS);
    let services = services_on(&settings, &canary_queues(&settings)).await;
    let ids: Vec<u64> = (1..=50).collect();
    let messages: Vec<_> = ids
        .iter()
        .flat_map(|&ping_id| {
            (0..3).map(move |_| {
                let mut envelope = Envelope::new(Ping { ping_id });
                envelope.shard_key = None;
                envelope.to_outgoing().unwrap()
            })
        })
        .collect();

    for result in services.publisher().publish_events(&messages).await {
        result.unwrap();
    }
    let landed = shards_of_each_ping(&services, &settings).await;

    assert_eq!(landed.len(), ids.len());
    let split = landed.values().filter(|s| s.len() > 1).count();
    assert!(split > ids.len() / 2, "only {split} of {} split", ids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sharded_function_consumes_every_shard_and_pongs_each_ping_once() {
    let counts = OutcomeCounts::take().await;
    let env = TestEnv::new().await;
    let settings = sharded(&env, SHARDS);
    let services = Services::connect(settings.clone()).await.unwrap();
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(Canary);
    assert_eq!(runner.queues(), canary_queues(&settings).as_slice());
    let token = shutdown.clone();
    let running = tokio::spawn(async move { runner.run(token).await.unwrap() });
    let consuming = eventually(Duration::from_secs(30), || async {
        let mut all = true;
        for queue in canary_queues(&settings) {
            all &= queue_state(&services, &queue.queue()).await.map(|s| s.1) == Some(1);
        }
        all
    })
    .await;
    assert!(consuming, "one consumer on each shard");
    let ids = insert_pings(&env, 300).await;

    publish_pings(&services, &ids, 3).await;
    // Every message handled (the duplicates too), not only every ping ponged.
    let handled = eventually(Duration::from_secs(120), || async {
        counts.count(Canary::FUNCTION, "done") + counts.count(Canary::FUNCTION, "skipped") >= 900
    })
    .await;
    let ponged = scalar(
        &env.db,
        "SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'",
    )
    .await;
    shutdown.cancel();
    running.await.unwrap();

    assert!(handled, "every message handled");
    assert_eq!(ponged, 300, "every ping ponged");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT CAST(SUM(pongs) AS SIGNED) FROM canary_pings"
        )
        .await,
        300,
        "each once, 900 messages on four shards"
    );
    for queue in canary_queues(&settings) {
        let (messages, _consumers) = queue_state(&services, &queue.queue()).await.unwrap();
        assert_eq!(messages, 0, "{}", queue.queue());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_shard_count_retires_the_old_queues_and_drains_them_into_the_new() {
    let env = TestEnv::new().await;
    // One queue, with 40 pings in it nobody consumed yet.
    let one = env.settings.clone();
    let services = services_on(&one, &canary_queues(&one)).await;
    let ids: Vec<u64> = (1..=40).collect();
    publish_pings(&services, &ids, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(queue_state(&services, "paybus.canary").await, Some((40, 0)));

    // Four shards: the old queue is unbound and reported with what it holds.
    let four = sharded(&env, SHARDS);
    services
        .declare_topology(&canary_queues(&four))
        .await
        .unwrap();
    let retired = services
        .retire(&canary_queues(&four), &canary_queues(&one))
        .await
        .unwrap();
    publish_pings(&services, &[41, 42, 43, 44, 45, 46, 47, 48, 49, 50], 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let still_old = queue_state(&services, "paybus.canary").await;
    let moved = topology::drain(&services.connection(), "paybus.canary")
        .await
        .unwrap();
    let on_shards = shards_of_each_ping(&services, &four).await;

    assert_eq!(retired.len(), 1, "{retired:?}");
    assert_eq!(retired[0].queue, "paybus.canary");
    assert_eq!(retired[0].messages, 40);
    assert_eq!(
        still_old,
        Some((40, 0)),
        "nothing new reached the retired queue"
    );
    assert_eq!(moved, 40);
    assert_eq!(queue_state(&services, "paybus.canary").await, Some((0, 0)));
    assert_eq!(
        on_shards.keys().copied().collect::<Vec<_>>(),
        (1..=50).collect::<Vec<u64>>(),
        "all fifty on the shards, the drained ones included"
    );
    assert!(on_shards.values().all(|s| s.len() == 1));

    // And back to one queue: the shards are retired, the events reach paybus.canary again.
    services
        .declare_topology(&canary_queues(&one))
        .await
        .unwrap();
    let retired = services
        .retire(&canary_queues(&one), &canary_queues(&four))
        .await
        .unwrap();
    publish_pings(&services, &[51], 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let names: Vec<&str> = retired.iter().map(|r| r.queue.as_str()).collect();
    assert_eq!(
        names,
        [
            "paybus.canary.s0",
            "paybus.canary.s1",
            "paybus.canary.s2",
            "paybus.canary.s3"
        ]
    );
    assert_eq!(queue_state(&services, "paybus.canary").await, Some((1, 0)));
    for shard in names {
        assert_eq!(queue_state(&services, shard).await, Some((0, 0)), "{shard}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sharded_lambda_takes_events_of_each_shard_and_refuses_the_unsharded_queue() {
    let _turn = OutcomeCounts::take().await;
    let env = TestEnv::new().await;
    let settings = sharded(&env, SHARDS);
    let services = services_on(&settings, &canary_queues(&settings)).await;
    let ids = insert_pings(&env, SHARDS.into()).await;

    let mut answers = Vec::new();
    for (shard, &ping_id) in ids.iter().enumerate() {
        let event = MqEvent::new(&topology::shard_queue_name(Canary::FUNCTION, shard as u16))
            .envelope(&Envelope::new(Ping { ping_id }))
            .event();
        answers.push(handle_event(&Canary, &services, event).await.unwrap());
    }
    let unsharded = MqEvent::new("paybus.canary")
        .envelope(&Envelope::new(Ping { ping_id: ids[0] }))
        .event();
    let refused = handle_event(&Canary, &services, unsharded)
        .await
        .unwrap_err();

    assert!(answers.iter().all(|a| *a
        == BatchSummary {
            processed: 1,
            acked: 1,
            dead_lettered: 0
        }));
    assert!(
        matches!(refused, InvocationError::WrongQueue(_)),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("paybus.canary.s3"),
        "{refused}"
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT CAST(SUM(pongs) AS SIGNED) FROM canary_pings"
        )
        .await,
        i64::from(SHARDS)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_event_carries_its_shard_key_header_sharded_or_not() {
    // The header is on every message (also of unsharded layouts), so a later change of the
    // shard count routes the messages already in flight by their entity too; without a key
    // in the envelope, the message id stands in.
    let env = TestEnv::new().await;
    let services = services_on(&env.settings, &[Canary::queue()]).await;
    let keyed = Envelope::new(Ping { ping_id: 7 }).to_outgoing().unwrap();
    let mut unkeyed = Envelope::new(Ping { ping_id: 8 });
    unkeyed.shard_key = None;
    let unkeyed = unkeyed.to_outgoing().unwrap();
    for result in services
        .publisher()
        .publish_events(&[keyed, unkeyed.clone()])
        .await
    {
        result.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let channel = services.connection().create_channel().await.unwrap();
    let taken = take_all(&channel, "paybus.canary").await;

    let key = |n: usize| {
        paybus_bus::headers::header_text(
            taken[n].properties.headers().as_ref(),
            topology::SHARD_KEY_HEADER,
        )
    };
    assert_eq!(taken.len(), 2);
    assert_eq!(key(0).as_deref(), Some("7"));
    assert_eq!(key(1), Some(unkeyed.id.to_string()));
}
