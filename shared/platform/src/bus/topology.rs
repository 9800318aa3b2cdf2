//! Exchanges and queues (SPEC §3), declared idempotently by code and mirrored in
//! `infra/rabbitmq/definitions.json` (kept equal by a test).
//!
//! ```text
//! paybus.events (topic) ──<message type>──► paybus.<function>   (quorum, delivery limit)
//!       │ alternate exchange: what no queue binds
//!       ▼
//! paybus.unrouted (fanout) ───────────────► paybus.unrouted      (quorum) → dead letters
//! paybus.dlx (direct)   ──<function>──────► paybus.<function>.dlq (quorum)
//! ```
//! A function's queue dead-letters to `paybus.dlx` with its own name as routing key, so the
//! broker's own dead letters (delivery limit reached) and the runtime's (`Failed`, malformed)
//! land in the same `.dlq`.

use lapin::{
    Channel, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable, ShortString},
};
use serde_json::json;

pub const EVENTS_EXCHANGE: &str = "paybus.events";
pub const DEAD_LETTER_EXCHANGE: &str = "paybus.dlx";
/// `paybus.events`' alternate exchange: a message no function binds is not dropped by the
/// broker but lands in [`UNROUTED_QUEUE`], whose recorder turns it into a dead letter.
pub const UNROUTED_EXCHANGE: &str = "paybus.unrouted";
pub const UNROUTED_QUEUE: &str = "paybus.unrouted";

/// Deliveries of one message before the broker dead-letters it on its own: the guard
/// against a message that crashes its consumer every time (a poison message).
pub const DELIVERY_LIMIT: i32 = 20;

/// What the topology needs to know about one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionQueue {
    /// e.g. `confirm-withdrawal`
    pub function: &'static str,
    /// The message type (routing key) it consumes, e.g. `withdrawal.tx_confirmed`.
    pub routing_key: &'static str,
}

impl FunctionQueue {
    pub fn queue(&self) -> String {
        queue_name(self.function)
    }

    pub fn dead_letter_queue(&self) -> String {
        dead_letter_queue_name(self.function)
    }
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
    for f in functions {
        channel
            .queue_declare(
                f.queue().as_str().into(),
                durable_queue,
                queue_arguments(f.function),
            )
            .await?;
        channel
            .queue_bind(
                f.queue().as_str().into(),
                EVENTS_EXCHANGE.into(),
                f.routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
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

/// The same topology as a RabbitMQ definitions document (for `rabbitmqctl import_definitions`
/// or the management UI), for the vhost `vhost`.
pub fn definitions(vhost: &str, functions: &[FunctionQueue]) -> serde_json::Value {
    let mut queues = Vec::new();
    let mut bindings = Vec::new();
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
        queues.push(json!({
            "name": f.dead_letter_queue(), "vhost": vhost, "durable": true, "auto_delete": false,
            "arguments": {"x-queue-type": "quorum"}
        }));
        bindings.push(json!({
            "source": EVENTS_EXCHANGE, "vhost": vhost, "destination": f.queue(),
            "destination_type": "queue", "routing_key": f.routing_key, "arguments": {}
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
        "exchanges": [
            {"name": EVENTS_EXCHANGE, "vhost": vhost, "type": "topic", "durable": true,
             "auto_delete": false, "internal": false,
             "arguments": {"alternate-exchange": UNROUTED_EXCHANGE}},
            {"name": UNROUTED_EXCHANGE, "vhost": vhost, "type": "fanout", "durable": true,
             "auto_delete": false, "internal": false, "arguments": {}},
            {"name": DEAD_LETTER_EXCHANGE, "vhost": vhost, "type": "direct", "durable": true,
             "auto_delete": false, "internal": false, "arguments": {}},
        ],
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
