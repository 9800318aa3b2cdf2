//! The message envelope every paybus message travels in (docs/bus.md).

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use uuid::Uuid;

use paybus_telemetry::TraceHeaders;

/// A message's data, tied to the routing key it travels under.
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The envelope's `type`, which is also the routing key on `paybus.events`.
    const TYPE: &'static str;

    /// The entity this message is about (its withdrawal, job, order…), as the shard key: a
    /// sharded function gets every message of one entity on the same shard (see
    /// `topology`'s module comment). `None`: the message's own id stands in for it (its
    /// copies still meet on one shard, other messages of the entity may not).
    fn shard_key(&self) -> Option<String> {
        None
    }

    /// The version of this type's data, carried in every envelope. Raised when a consumer of
    /// the version before would do the wrong thing with the new data; a consumer holds a
    /// message newer than it knows until one that knows it runs (docs/bus.md, "Changing a
    /// message"), and reads its own version and the one before.
    const VERSION: u16 = 1;
}

/// The version of an envelope that names none: every message of the releases before versions.
fn first_version() -> u16 {
    1
}

/// `{"id", "type", "version", "occurred_at", "correlation_id", "shard_key", "data"}`. `id`
/// identifies this message (and is the AMQP `message_id`); `version` is its data's
/// ([`Message::VERSION`]; 1 when absent); `correlation_id` follows one business flow across
/// messages; `shard_key` names the entity ([`Message::shard_key`]; absent when it has none,
/// and in messages of earlier releases) and travels in the `x-paybus-shard-key` header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub id: Uuid,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "first_version")]
    pub version: u16,
    pub occurred_at: DateTime<Utc>,
    pub correlation_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_key: Option<String>,
    pub data: T,
}

impl<T: Message> Envelope<T> {
    /// A message that starts a new flow (its correlation id is its own id).
    pub fn new(data: T) -> Self {
        let mut envelope = Self::with_correlation(Uuid::nil(), data);
        envelope.correlation_id = envelope.id;
        envelope
    }

    /// A message caused by another one: it carries the same correlation id.
    pub fn with_correlation(correlation_id: Uuid, data: T) -> Self {
        Self {
            id: Uuid::now_v7(),
            kind: T::TYPE.to_owned(),
            version: T::VERSION,
            // MySQL keeps microseconds; rounding here keeps a stored and a sent copy equal.
            occurred_at: Utc::now().trunc_subsecs(6),
            correlation_id,
            shard_key: data.shard_key(),
            data,
        }
    }

    /// The serialised form, ready for the outbox or the publisher, with the trace context of
    /// the span that sends it (in a batch, of the delivery that caused it:
    /// [`TraceHeaders::caused_by`]).
    pub fn to_outgoing(&self) -> Result<OutgoingMessage, serde_json::Error> {
        Ok(OutgoingMessage {
            id: self.id,
            routing_key: self.kind.clone(),
            correlation_id: self.correlation_id,
            occurred_at: self.occurred_at,
            body: serde_json::to_vec(self)?,
            trace: TraceHeaders::caused_by(self.correlation_id),
        })
    }
}

/// A serialised envelope and what the AMQP properties need from it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutgoingMessage {
    pub id: Uuid,
    pub routing_key: String,
    pub correlation_id: Uuid,
    pub occurred_at: DateTime<Utc>,
    pub body: Vec<u8>,
    /// The W3C trace context of the transaction that wrote it: kept on the outbox row and sent
    /// as the `traceparent` / `tracestate` headers, so the consumer's span continues the trace.
    pub trace: TraceHeaders,
}

impl OutgoingMessage {
    /// A serialised envelope sent again: a new id and time (a message id names one publication;
    /// the original's outbox row may still hold it), the same type, version, correlation id and
    /// data, continuing the trace of the span that sends it (a replay, a held message released).
    pub fn resend(body: &[u8]) -> Result<Self, serde_json::Error> {
        let original: Envelope<serde_json::Value> = serde_json::from_slice(body)?;
        let again = Envelope {
            id: Uuid::now_v7(),
            occurred_at: Utc::now().trunc_subsecs(6),
            ..original
        };
        Ok(Self {
            id: again.id,
            routing_key: again.kind.clone(),
            correlation_id: again.correlation_id,
            occurred_at: again.occurred_at,
            body: serde_json::to_vec(&again)?,
            trace: TraceHeaders::current(),
        })
    }
}

/// The part of an envelope that can be read without knowing its data type: enough to route,
/// log and dead-letter a message whose data is malformed.
#[derive(Debug, Clone, Deserialize)]
pub struct EnvelopeHead {
    pub id: Uuid,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "first_version")]
    pub version: u16,
    pub correlation_id: Uuid,
}

/// A serialised envelope's shard key, read without its data type (the publisher sets the
/// header from it, whichever way the message reached it: the fast path, the relay's rows, a
/// replay). `None` for a body that is not an envelope or has none.
pub fn shard_key_of(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Keyed {
        shard_key: Option<String>,
    }
    serde_json::from_slice::<Keyed>(body).ok()?.shard_key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Ping {
        n: u32,
    }
    impl Message for Ping {
        const TYPE: &'static str = "test.ping";

        fn shard_key(&self) -> Option<String> {
            Some(format!("ping-{}", self.n))
        }
    }

    #[test]
    fn a_new_flow_correlates_with_itself_and_round_trips() {
        let envelope = Envelope::new(Ping { n: 7 });
        assert_eq!(envelope.correlation_id, envelope.id);
        let outgoing = envelope.to_outgoing().unwrap();
        assert_eq!(outgoing.routing_key, "test.ping");
        let json: serde_json::Value = serde_json::from_slice(&outgoing.body).unwrap();
        assert_eq!(json["type"], "test.ping");
        assert_eq!(json["version"], Ping::VERSION);
        assert_eq!(json["data"]["n"], 7);
        let back: Envelope<Ping> = serde_json::from_slice(&outgoing.body).unwrap();
        assert_eq!(back, envelope);
    }

    #[test]
    fn the_shard_key_travels_in_the_envelope_and_reads_back_without_the_type() {
        let outgoing = Envelope::new(Ping { n: 7 }).to_outgoing().unwrap();
        assert_eq!(shard_key_of(&outgoing.body).as_deref(), Some("ping-7"));
        // An envelope of an earlier release (no shard_key) still reads, as `None`.
        let earlier = br#"{"id":"019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d01","type":"test.ping","occurred_at":"2026-01-05T09:30:00Z","correlation_id":"019b8d6a-3c40-7a11-8d2e-3f5a9c1b2d01","data":{"n":1}}"#;
        let read: Envelope<Ping> = serde_json::from_slice(earlier).unwrap();
        assert_eq!(read.shard_key, None);
        assert_eq!(
            read.version, 1,
            "an envelope of a release before versions is version 1"
        );
        assert_eq!(shard_key_of(earlier), None);
        assert_eq!(shard_key_of(b"not json"), None);
    }

    #[test]
    fn a_caused_message_keeps_the_correlation_id() {
        let first = Envelope::new(Ping { n: 1 });
        let second = Envelope::with_correlation(first.correlation_id, Ping { n: 2 });
        assert_ne!(second.id, first.id);
        assert_eq!(second.correlation_id, first.correlation_id);
    }
}
