//! Every message delivered `copies` times, and one malformed message in `malformed_every`.
//!
//! A tap queue bound to `#` on `paybus.events` sees every event the system publishes; for each
//! it publishes `copies - 1` copies (same body and properties, so the same message id) straight
//! to the function's queue, all at once, while the original is usually being handled: the
//! duplicates a chain monitor, a relay racing the fast path or a broker redelivery produce.
//! Copies go through the default exchange (a sharded function's: its hash exchange, which puts
//! them on the original's shard by the same shard-key header), so the tap never sees them
//! again. A malformed message (a body that is not an envelope, carrying a numbered marker)
//! goes the same way; the checks find each marker among the dead letters with reason
//! `malformed`.
//!
//! The tap is acked only after its copies are confirmed, so a broker restart loses none: the
//! loop resubscribes on the new connection and the unacked delivery comes back.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use lapin::{
    BasicProperties,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    types::FieldTable,
};
use paybus_bus::{Services, link::BrokerLink, publisher::Publisher, topology};
use tokio_util::sync::CancellationToken;

use super::Profile;

/// The tap's queue: a quorum queue, so a broker restart keeps what it had not copied yet, and
/// on a cluster the death of one node neither loses it nor makes it unavailable (a classic
/// queue lives on one node only).
pub(crate) const TAP_QUEUE: &str = "chaos.tap";

/// How often the tap checks that its consumer still receives what its queue holds.
const STALL_CHECK: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Counters {
    seen: AtomicU64,
    copies: AtomicU64,
    /// Markers of the malformed messages injected (confirmed by the broker).
    malformed: Mutex<Vec<u64>>,
}

pub(crate) struct Duplicator {
    counters: Arc<Counters>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Duplicator {
    pub(crate) async fn start(
        services: &Services,
        profile: &Profile,
        stop: CancellationToken,
    ) -> anyhow::Result<Self> {
        declare_tap(&services.link).await?;
        // Where a copy goes, by routing key: (exchange, routing key).
        let queues: HashMap<String, (String, String)> =
            paybus_catalog::queues(&services.settings.broker.shards)
                .iter()
                .map(|q| {
                    let target = if q.shard.count > 1 {
                        (
                            topology::shard_exchange_name(q.function),
                            q.routing_key.to_owned(),
                        )
                    } else {
                        (String::new(), q.queue())
                    };
                    (q.routing_key.to_owned(), target)
                })
                .collect();
        let counters = Arc::new(Counters::default());
        let stop = stop.child_token();
        let task = tokio::spawn(run(
            services.link.clone(),
            services.publisher().clone(),
            Arc::new(queues),
            profile.copies,
            profile.malformed_every,
            counters.clone(),
            stop.clone(),
        ));
        Ok(Self {
            counters,
            stop,
            task,
        })
    }

    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        while !self.task.is_finished() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn seen(&self) -> u64 {
        self.counters.seen.load(Ordering::Relaxed)
    }

    pub(crate) fn copies(&self) -> u64 {
        self.counters.copies.load(Ordering::Relaxed)
    }

    pub(crate) fn malformed(&self) -> Vec<u64> {
        self.counters
            .malformed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

async fn declare_tap(link: &BrokerLink) -> Result<lapin::Channel, lapin::Error> {
    let channel = link.current().connection.create_channel().await?;
    channel
        .queue_declare(
            TAP_QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::from(std::collections::BTreeMap::from([(
                "x-queue-type".into(),
                lapin::types::AMQPValue::LongString("quorum".into()),
            )])),
        )
        .await?;
    channel
        .queue_bind(
            TAP_QUEUE.into(),
            topology::EVENTS_EXCHANGE.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(channel)
}

/// The body of malformed message `marker`: JSON, but not an envelope.
pub(crate) fn malformed_body(marker: u64) -> Vec<u8> {
    format!("{{\"chaos_malformed\": {marker}, \"data\": ").into_bytes()
}

async fn run(
    link: BrokerLink,
    publisher: Publisher,
    queues: Arc<HashMap<String, (String, String)>>,
    copies: u32,
    malformed_every: u64,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        // Every await of a consumer can wait on a broker connection that died without a word
        // (an ack, a declare, a copy's publish, the stall check's count): the stop drops the
        // consumer whatever it awaits, or a 4-shard chaos test's duplicator can still be
        // running 30 s after its stop with hundreds of messages left in the tap.
        let result = tokio::select! {
            () = stop.cancelled() => break,
            result = consume(
                &link,
                &publisher,
                &queues,
                copies,
                malformed_every,
                &counters,
            ) => result,
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "chaos tap: reconnecting");
        }
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

async fn consume(
    link: &BrokerLink,
    publisher: &Publisher,
    queues: &HashMap<String, (String, String)>,
    copies: u32,
    malformed_every: u64,
    counters: &Counters,
) -> Result<(), lapin::Error> {
    let channel = declare_tap(link).await?;
    channel.basic_qos(64, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            TAP_QUEUE.into(),
            "chaos-tap".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut last_delivery = Instant::now();
    let mut watch = tokio::time::interval(STALL_CHECK);
    loop {
        let delivery = tokio::select! {
            _ = watch.tick() => {
                // A consumer can outlive its queue's leader on a restarted node and never be
                // told (the four-shard run once left 334 messages in the tap this way): when
                // the tap holds messages and none came for a while, consume afresh.
                if last_delivery.elapsed() > STALL_CHECK {
                    // A count the broker does not give within the check's period is a stall too.
                    let waiting = tokio::time::timeout(
                        STALL_CHECK,
                        super::broker::ready(&channel, TAP_QUEUE),
                    )
                    .await;
                    if !matches!(waiting, Ok(Ok(0))) {
                        tracing::warn!(?waiting,
                            "chaos tap: no delivery while messages wait (or no count); consuming afresh");
                        return Ok(());
                    }
                }
                continue;
            }
            next = deliveries.next() => match next {
                Some(delivery) => delivery?,
                None => return Ok(()),
            },
        };
        last_delivery = Instant::now();
        let routing_key = delivery.routing_key.to_string();
        let Some((exchange, queue)) = queues.get(&routing_key) else {
            // Nothing binds it (e.g. a type no function consumes): nothing to duplicate.
            delivery.ack(BasicAckOptions::default()).await?;
            continue;
        };
        let n = counters.seen.fetch_add(1, Ordering::Relaxed) + 1;
        let sends = (1..copies).map(|_| {
            publisher.publish_raw(exchange, queue, &delivery.data, delivery.properties.clone())
        });
        let all = futures_util::future::join_all(sends).await;
        if let Some(Err(e)) = all.into_iter().find(Result::is_err) {
            // Not acked: the tap delivers it again (more copies: still "at least copies").
            tracing::debug!(error = %e, "chaos tap: a copy was not confirmed");
            return Ok(());
        }
        counters
            .copies
            .fetch_add(u64::from(copies - 1), Ordering::Relaxed);
        if n.is_multiple_of(malformed_every) {
            let marker = n / malformed_every;
            let properties = BasicProperties::default()
                .with_message_id(format!("chaos-malformed-{marker}").as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            if publisher
                .publish_raw(exchange, queue, &malformed_body(marker), properties)
                .await
                .is_ok()
            {
                counters
                    .malformed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(marker);
            }
        }
        delivery.ack(BasicAckOptions::default()).await?;
    }
}
