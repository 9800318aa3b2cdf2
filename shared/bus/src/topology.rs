//! Exchanges and queues, declared idempotently by code and mirrored in
//! `infra/rabbitmq/definitions.json` (kept equal by a test); the layout and its sharding are in
//! docs/bus.md ("Topology", "Shards").
//!
//! ```text
//! paybus.events (topic) ──<message type>──► paybus.<function>   (quorum, delivery limit)
//!       │ alternate exchange: what no queue binds
//!       ▼
//! paybus.unrouted (fanout) ───────────────► paybus.unrouted      (quorum) → dead letters
//! paybus.dlx (direct)   ──<function>──────► paybus.<function>.dlq (quorum)
//! ```
//! A sharded function ([`Shards`]) has `paybus.<function>.s0 … sN-1` behind a consistent-hash
//! exchange on `x-paybus-shard-key`, so every message of one entity lands on one shard; all
//! shards share the one `.dlq`. Changing `N` never drops a queue: the old layout's queues are
//! unbound ([`retire`]) and later drained back into `paybus.events` ([`drain`]).

use lapin::{
    Channel, Connection, ExchangeKind,
    options::{
        BasicAckOptions, BasicGetOptions, BasicPublishOptions, ExchangeBindOptions,
        ExchangeDeclareOptions, ExchangeUnbindOptions, QueueBindOptions, QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable, ShortString},
};
use serde_json::json;

use paybus_config::Shards;

pub const EVENTS_EXCHANGE: &str = "paybus.events";
pub const DEAD_LETTER_EXCHANGE: &str = "paybus.dlx";
/// `paybus.events`' alternate exchange: a message no function binds is not dropped by the
/// broker but lands in [`UNROUTED_QUEUE`], whose recorder turns it into a dead letter.
pub const UNROUTED_EXCHANGE: &str = "paybus.unrouted";
pub const UNROUTED_QUEUE: &str = "paybus.unrouted";

/// Deliveries of one message before the broker dead-letters it on its own: the guard
/// against a message that crashes its consumer every time (a poison message).
pub const DELIVERY_LIMIT: i32 = 20;

/// The header that carries a message's shard key (its entity's id), the one the sharded
/// functions' consistent-hash exchanges hash on.
pub const SHARD_KEY_HEADER: &str = "x-paybus-shard-key";

/// One queue of a function: the only one, or shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shard {
    pub index: u16,
    pub count: u16,
}

impl Shard {
    /// An unsharded function's one queue.
    pub const ONE: Shard = Shard { index: 0, count: 1 };
}

/// What the topology needs to know about one queue of a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionQueue {
    /// e.g. `confirm-withdrawal`
    pub function: &'static str,
    /// The message type (routing key) it consumes, e.g. `withdrawal.tx_confirmed`.
    pub routing_key: &'static str,
    /// Which of the function's queues this is ([`Shard::ONE`] unless it is sharded).
    pub shard: Shard,
}

impl FunctionQueue {
    /// The function's queue when it is not sharded.
    pub const fn new(function: &'static str, routing_key: &'static str) -> Self {
        Self {
            function,
            routing_key,
            shard: Shard::ONE,
        }
    }

    /// `paybus.<function>`, or `paybus.<function>.s<index>` for a shard.
    pub fn queue(&self) -> String {
        if self.shard.count > 1 {
            shard_queue_name(self.function, self.shard.index)
        } else {
            queue_name(self.function)
        }
    }

    pub fn dead_letter_queue(&self) -> String {
        dead_letter_queue_name(self.function)
    }

    /// The function's queues in `layout`: its one queue, or each of its shards.
    pub fn queues_in(self, layout: &Shards) -> Vec<FunctionQueue> {
        self.sharded(layout.of(self.function))
    }

    /// The function's queues when it has `count` shards (its one queue for 0 or 1).
    pub fn sharded(self, count: u16) -> Vec<FunctionQueue> {
        if count <= 1 {
            return vec![Self {
                shard: Shard::ONE,
                ..self
            }];
        }
        (0..count)
            .map(|index| Self {
                shard: Shard { index, count },
                ..self
            })
            .collect()
    }
}

/// `paybus.<function>.s<index>`: shard `index` of a sharded function.
pub fn shard_queue_name(function: &str, index: u16) -> String {
    format!("paybus.{function}.s{index}")
}

/// `paybus.<function>.shards`: the consistent-hash exchange in front of a function's shards.
pub fn shard_exchange_name(function: &str) -> String {
    format!("paybus.{function}.shards")
}

pub fn queue_name(function: &str) -> String {
    format!("paybus.{function}")
}

pub fn dead_letter_queue_name(function: &str) -> String {
    format!("paybus.{function}.dlq")
}

/// The function whose dead-letter queue `queue` is (`paybus.<function>.dlq`), if it is one.
pub fn dead_letter_queue_function(queue: &str) -> Option<&str> {
    queue
        .strip_prefix("paybus.")?
        .strip_suffix(".dlq")
        .filter(|function| !function.is_empty())
}

fn queue_arguments(function: &str) -> FieldTable {
    let mut args = FieldTable::default();
    let text = |s: &str| AMQPValue::LongString(s.into());
    args.insert(ShortString::from("x-queue-type"), text("quorum"));
    args.insert(
        ShortString::from("x-dead-letter-exchange"),
        text(DEAD_LETTER_EXCHANGE),
    );
    args.insert(
        ShortString::from("x-dead-letter-routing-key"),
        text(function),
    );
    args.insert(
        ShortString::from("x-delivery-limit"),
        AMQPValue::LongInt(DELIVERY_LIMIT),
    );
    // Without reject-publish, RabbitMQ silently falls back to at-most-once dead-lettering.
    args.insert(
        ShortString::from("x-dead-letter-strategy"),
        text("at-least-once"),
    );
    args.insert(ShortString::from("x-overflow"), text("reject-publish"));
    args
}

fn events_exchange_arguments() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("alternate-exchange"),
        AMQPValue::LongString(UNROUTED_EXCHANGE.into()),
    );
    args
}

fn dead_letter_queue_arguments() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString("quorum".into()),
    );
    args
}

/// Declares the exchanges, the unrouted queue and, for each function, its queue, its DLQ and
/// their bindings. Safe to repeat; a queue that exists with other arguments fails with
/// PRECONDITION_FAILED (and closes the channel) rather than being silently changed.
pub async fn declare(channel: &Channel, functions: &[FunctionQueue]) -> Result<(), lapin::Error> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    // The alternate exchange first: the events exchange names it.
    channel
        .exchange_declare(
            UNROUTED_EXCHANGE.into(),
            ExchangeKind::Fanout,
            durable,
            FieldTable::default(),
        )
        .await?;
    channel
        .exchange_declare(
            EVENTS_EXCHANGE.into(),
            ExchangeKind::Topic,
            durable,
            events_exchange_arguments(),
        )
        .await?;
    channel
        .exchange_declare(
            DEAD_LETTER_EXCHANGE.into(),
            ExchangeKind::Direct,
            durable,
            FieldTable::default(),
        )
        .await?;
    let durable_queue = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(
            UNROUTED_QUEUE.into(),
            durable_queue,
            dead_letter_queue_arguments(),
        )
        .await?;
    channel
        .queue_bind(
            UNROUTED_QUEUE.into(),
            UNROUTED_EXCHANGE.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut dead_letter_queues: Vec<String> = Vec::new();
    for f in functions {
        channel
            .queue_declare(
                f.queue().as_str().into(),
                durable_queue,
                queue_arguments(f.function),
            )
            .await?;
        if f.shard.count > 1 {
            let exchange = shard_exchange_name(f.function);
            channel
                .exchange_declare(
                    exchange.as_str().into(),
                    ExchangeKind::Custom(CONSISTENT_HASH.to_owned()),
                    durable,
                    shard_exchange_arguments(),
                )
                .await?;
            channel
                .exchange_bind(
                    exchange.as_str().into(),
                    EVENTS_EXCHANGE.into(),
                    f.routing_key.into(),
                    ExchangeBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            channel
                .queue_bind(
                    f.queue().as_str().into(),
                    exchange.as_str().into(),
                    SHARD_WEIGHT.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        } else {
            channel
                .queue_bind(
                    f.queue().as_str().into(),
                    EVENTS_EXCHANGE.into(),
                    f.routing_key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        if dead_letter_queues.contains(&f.dead_letter_queue()) {
            continue;
        }
        dead_letter_queues.push(f.dead_letter_queue());
        channel
            .queue_declare(
                f.dead_letter_queue().as_str().into(),
                durable_queue,
                dead_letter_queue_arguments(),
            )
            .await?;
        channel
            .queue_bind(
                f.dead_letter_queue().as_str().into(),
                DEAD_LETTER_EXCHANGE.into(),
                f.function.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    Ok(())
}

/// The exchange type of RabbitMQ's consistent-hash exchange plugin
/// (`rabbitmq_consistent_hash_exchange`, shipped with RabbitMQ and enabled on Amazon MQ).
pub const CONSISTENT_HASH: &str = "x-consistent-hash";

/// Every shard queue's binding weight (its share of the hash space): equal shares.
const SHARD_WEIGHT: &str = "1";

fn shard_exchange_arguments() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("hash-header"),
        AMQPValue::LongString(SHARD_KEY_HEADER.into()),
    );
    args
}

/// A queue the layout no longer routes to, and what it still held when it was retired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    pub queue: String,
    pub function: &'static str,
    pub messages: u32,
}

/// Unbinds the queues of the `earlier` layout that the `current` one does not have (see the
/// module's comment): a function's unsharded queue once it is sharded, its shards past the new
/// count, and, for a function back to one queue, its hash exchange from `paybus.events`.
/// Nothing is deleted: each retired queue is returned with the messages it still holds, to be
/// drained. `earlier` must be what was declared before (a deploy knows it: CloudFormation
/// hands `migrate` the old `Queues`; `paybus topology --previous-shards` is told): the broker
/// cannot be asked which queues exist without failing a channel for each one that does not.
pub async fn retire(
    connection: &Connection,
    current: &[FunctionQueue],
    earlier: &[FunctionQueue],
) -> Result<Vec<Retired>, lapin::Error> {
    let channel = connection.create_channel().await?;
    let current_names: Vec<String> = current.iter().map(FunctionQueue::queue).collect();
    let mut retired = Vec::new();
    let mut unbound_exchanges: Vec<&str> = Vec::new();
    for old in earlier {
        if current_names.contains(&old.queue()) {
            continue;
        }
        if old.shard.count > 1 {
            channel
                .queue_unbind(
                    old.queue().as_str().into(),
                    shard_exchange_name(old.function).as_str().into(),
                    SHARD_WEIGHT.into(),
                    FieldTable::default(),
                )
                .await?;
            let still_sharded = current
                .iter()
                .any(|q| q.function == old.function && q.shard.count > 1);
            if !still_sharded && !unbound_exchanges.contains(&old.function) {
                unbound_exchanges.push(old.function);
                channel
                    .exchange_unbind(
                        shard_exchange_name(old.function).as_str().into(),
                        EVENTS_EXCHANGE.into(),
                        old.routing_key.into(),
                        ExchangeUnbindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
            }
        } else {
            channel
                .queue_unbind(
                    old.queue().as_str().into(),
                    EVENTS_EXCHANGE.into(),
                    old.routing_key.into(),
                    FieldTable::default(),
                )
                .await?;
        }
        let held = channel
            .queue_declare(
                old.queue().as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?
            .message_count();
        retired.push(Retired {
            queue: old.queue(),
            function: old.function,
            messages: held,
        });
    }
    let _ = channel.close(200, "retired".into()).await;
    for r in retired.iter().filter(|r| r.messages > 0) {
        tracing::warn!(
            queue = %r.queue,
            messages = r.messages,
            "a queue of the earlier shard layout still holds messages: drain it (paybus topology --drain-retired)"
        );
    }
    Ok(retired)
}

/// The function queue a queue name stands for among `functions` (`paybus.<function>` or
/// `paybus.<function>.s<index>`), its shard count being how many of `names` are its shards:
/// an earlier layout read back from queue names (a deploy's old `Queues`). Names of no known
/// function are left out.
pub fn layout_of(names: &[String], functions: &[FunctionQueue]) -> Vec<FunctionQueue> {
    let parse = |name: &str| -> Option<(String, Option<u16>)> {
        let rest = name.strip_prefix("paybus.")?;
        match rest.split_once('.') {
            None => Some((rest.to_owned(), None)),
            Some((function, shard)) => Some((
                function.to_owned(),
                Some(shard.strip_prefix('s')?.parse().ok()?),
            )),
        }
    };
    let parsed: Vec<(String, Option<u16>)> = names.iter().filter_map(|n| parse(n)).collect();
    let mut layout = Vec::new();
    for (function, index) in &parsed {
        let Some(known) = functions.iter().find(|f| f.function == function) else {
            continue;
        };
        let count = parsed
            .iter()
            .filter(|(f, i)| f == function && i.is_some())
            .count();
        let shard = match index {
            None => Shard::ONE,
            Some(index) => Shard {
                index: *index,
                count: u16::try_from(count).unwrap_or(u16::MAX),
            },
        };
        layout.push(FunctionQueue {
            function: known.function,
            routing_key: known.routing_key,
            shard,
        });
    }
    layout
}

/// Moves every message of the retired queue `queue` back into `paybus.events` under its
/// routing key, with its properties (so its shard key header), each acked only once the
/// publish is confirmed: the current layout routes it to its shard. Returns how many moved.
/// Run it once the queue has no consumer left (an earlier layout's trigger or process):
/// a consumer would take messages alongside.
pub async fn drain(connection: &Connection, queue: &str) -> Result<u64, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await?;
    let mut moved = 0;
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: false })
        .await?
    {
        let delivery = message.delivery;
        let confirm = channel
            .basic_publish(
                EVENTS_EXCHANGE.into(),
                delivery.routing_key.as_str().into(),
                BasicPublishOptions::default(),
                &delivery.data,
                delivery.properties.clone(),
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            // Left in the queue (requeued when the channel closes): try again later.
            return Err(lapin::Error::from(std::io::Error::other(format!(
                "the broker refused a message of {queue}; {moved} moved, the rest left in it"
            ))));
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
        moved += 1;
    }
    let _ = channel.close(200, "drained".into()).await;
    Ok(moved)
}

/// The same topology as a RabbitMQ definitions document (for `rabbitmqctl import_definitions`
/// or the management UI), for the vhost `vhost`.
pub fn definitions(vhost: &str, functions: &[FunctionQueue]) -> serde_json::Value {
    let mut queues = Vec::new();
    let mut bindings = Vec::new();
    let mut exchanges = vec![
        json!({"name": EVENTS_EXCHANGE, "vhost": vhost, "type": "topic", "durable": true,
               "auto_delete": false, "internal": false,
               "arguments": {"alternate-exchange": UNROUTED_EXCHANGE}}),
        json!({"name": UNROUTED_EXCHANGE, "vhost": vhost, "type": "fanout", "durable": true,
               "auto_delete": false, "internal": false, "arguments": {}}),
        json!({"name": DEAD_LETTER_EXCHANGE, "vhost": vhost, "type": "direct", "durable": true,
               "auto_delete": false, "internal": false, "arguments": {}}),
    ];
    let mut dead_letter_queues: Vec<String> = Vec::new();
    for f in functions {
        queues.push(json!({
            "name": f.queue(), "vhost": vhost, "durable": true, "auto_delete": false,
            "arguments": {
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
                "x-dead-letter-routing-key": f.function,
                "x-delivery-limit": DELIVERY_LIMIT,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            }
        }));
        if f.shard.count > 1 {
            let exchange = shard_exchange_name(f.function);
            if f.shard.index == 0 {
                exchanges.push(json!({
                    "name": exchange, "vhost": vhost, "type": CONSISTENT_HASH, "durable": true,
                    "auto_delete": false, "internal": false,
                    "arguments": {"hash-header": SHARD_KEY_HEADER}
                }));
                bindings.push(json!({
                    "source": EVENTS_EXCHANGE, "vhost": vhost, "destination": exchange,
                    "destination_type": "exchange", "routing_key": f.routing_key, "arguments": {}
                }));
            }
            bindings.push(json!({
                "source": exchange, "vhost": vhost, "destination": f.queue(),
                "destination_type": "queue", "routing_key": SHARD_WEIGHT, "arguments": {}
            }));
        } else {
            bindings.push(json!({
                "source": EVENTS_EXCHANGE, "vhost": vhost, "destination": f.queue(),
                "destination_type": "queue", "routing_key": f.routing_key, "arguments": {}
            }));
        }
        if dead_letter_queues.contains(&f.dead_letter_queue()) {
            continue;
        }
        dead_letter_queues.push(f.dead_letter_queue());
        queues.push(json!({
            "name": f.dead_letter_queue(), "vhost": vhost, "durable": true, "auto_delete": false,
            "arguments": {"x-queue-type": "quorum"}
        }));
        bindings.push(json!({
            "source": DEAD_LETTER_EXCHANGE, "vhost": vhost, "destination": f.dead_letter_queue(),
            "destination_type": "queue", "routing_key": f.function, "arguments": {}
        }));
    }
    queues.push(json!({
        "name": UNROUTED_QUEUE, "vhost": vhost, "durable": true, "auto_delete": false,
        "arguments": {"x-queue-type": "quorum"}
    }));
    bindings.push(json!({
        "source": UNROUTED_EXCHANGE, "vhost": vhost, "destination": UNROUTED_QUEUE,
        "destination_type": "queue", "routing_key": "", "arguments": {}
    }));
    json!({
        "vhosts": [{"name": vhost}],
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    })
}

/// Whether `error` is the broker refusing to redeclare `paybus.events` because it exists
/// without its alternate exchange (declared by a paybus before the unrouted queue existed).
pub fn is_events_exchange_without_alternate(error: &lapin::Error) -> bool {
    let text = error.to_string();
    text.contains("PRECONDITION_FAILED")
        && text.contains("alternate-exchange")
        && text.contains(EVENTS_EXCHANGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: FunctionQueue = FunctionQueue::new("a-fn", "a.happened");
    const B: FunctionQueue = FunctionQueue::new("b", "b.happened");

    #[test]
    fn shard_queues_are_numbered_and_one_shard_is_the_plain_queue() {
        let names: Vec<String> = A.sharded(3).iter().map(FunctionQueue::queue).collect();
        assert_eq!(
            names,
            ["paybus.a-fn.s0", "paybus.a-fn.s1", "paybus.a-fn.s2"]
        );
        assert_eq!(A.sharded(1), vec![A]);
        assert_eq!(A.sharded(0), vec![A]);
        assert!(
            A.sharded(3)
                .iter()
                .all(|q| q.dead_letter_queue() == "paybus.a-fn.dlq")
        );
    }

    #[test]
    fn an_earlier_layout_is_read_back_from_its_queue_names() {
        let layout = Shards::default().with("a-fn", 3);
        let names: Vec<String> = [A, B]
            .into_iter()
            .flat_map(|q| q.queues_in(&layout))
            .map(|q| q.queue())
            .chain(["paybus.gone".to_owned(), "other.queue".to_owned()])
            .collect();

        let read = layout_of(&names, &[A, B]);

        assert_eq!(read, [A.sharded(3), vec![B]].concat());
    }

    #[test]
    fn a_layout_prints_as_its_variable_reads_it() {
        let layout = Shards::parse("b=2, a-fn=4,c=1").unwrap();
        assert_eq!(layout.to_string(), "a-fn=4,b=2");
        assert_eq!(Shards::parse(&layout.to_string()).unwrap(), layout);
        assert_eq!(layout.with("b", 1).to_string(), "a-fn=4");
    }
}
