//! Publishing with publisher confirms: a message counts as sent only when the broker has
//! confirmed it. A nack, or a mandatory message returned as unroutable, is an error.
//!
//! While the broker blocks the link (a resource alarm, `bus::link`), a publish fails at once
//! naming the alarm: lapin writes nothing on a blocked connection, so the message would only
//! wait in its buffer, and the caller's outbox row is published by the relay once the alarm
//! clears. A publish that times out while the link is blocked says so too.

use std::time::Duration;

use lapin::{
    BasicProperties, Channel, Confirmation, PublisherConfirm, options::BasicPublishOptions,
    types::FieldTable,
};

use super::{
    envelope::{OutgoingMessage, shard_key_of},
    link::BrokerLink,
    topology::{EVENTS_EXCHANGE, SHARD_KEY_HEADER},
};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("broker error: {0}")]
    Broker(#[from] lapin::Error),
    #[error("broker refused (nack) message {message_id}")]
    Nacked { message_id: String },
    #[error(
        "no queue is bound for routing key {routing_key:?} on {exchange} (message {message_id})"
    )]
    Unroutable {
        exchange: String,
        routing_key: String,
        message_id: String,
    },
    #[error("the broker did not confirm within {0:?}")]
    Unconfirmed(Duration),
    #[error(
        "not sent: the broker blocks this connection ({reason}) until its resource alarm clears"
    )]
    Blocked { reason: String },
    #[error(
        "the broker did not confirm within {waited:?}: it blocks this connection ({reason}) until its resource alarm clears"
    )]
    UnconfirmedWhileBlocked { waited: Duration, reason: String },
}

/// A confirm that does not come is a failed publish: callers (the outbox fast path, the
/// relay holding its claimed rows, a dead letter before its ack) must not wait forever on a
/// broker that accepted the TCP bytes and went silent.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + CONFIRM_TIMEOUT
}

/// Publishes on the link's confirm-mode channel (whichever connection is live). Cheap to
/// clone; publishes from many tasks pipeline on it.
#[derive(Clone)]
pub struct Publisher {
    link: BrokerLink,
}

impl Publisher {
    pub fn new(link: BrokerLink) -> Self {
        Self { link }
    }

    fn channel(&self) -> Channel {
        self.link.current().publish_channel.clone()
    }

    /// The link it publishes on (what else a process asks the broker goes over it too).
    pub fn link(&self) -> &BrokerLink {
        &self.link
    }

    /// Hands one message's frames to lapin, until `deadline`: lapin resolves a publish once its
    /// frames are written, which on a connection the broker blocked since the last check is
    /// never (until the alarm clears).
    async fn send(
        &self,
        deadline: tokio::time::Instant,
        publish: impl Future<Output = Result<PublisherConfirm, PublishError>>,
    ) -> Result<PublisherConfirm, PublishError> {
        if let Some(reason) = self.link.blocked() {
            return Err(PublishError::Blocked { reason });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(self.timed_out());
        }
        tokio::time::timeout_at(deadline, publish)
            .await
            .unwrap_or_else(|_| Err(self.timed_out()))
    }

    /// Waits for one confirm until `deadline` (one deadline for a whole pipelined batch).
    async fn confirmation(
        &self,
        pending: PublisherConfirm,
        deadline: tokio::time::Instant,
    ) -> Result<Confirmation, PublishError> {
        match tokio::time::timeout_at(deadline, pending).await {
            Ok(confirmed) => Ok(confirmed?),
            Err(_) => Err(self.timed_out()),
        }
    }

    /// A publish that timed out, naming the broker's alarm when it blocks the link.
    fn timed_out(&self) -> PublishError {
        match self.link.blocked() {
            Some(reason) => PublishError::UnconfirmedWhileBlocked {
                waited: CONFIRM_TIMEOUT,
                reason,
            },
            None => PublishError::Unconfirmed(CONFIRM_TIMEOUT),
        }
    }

    /// Publishes one event to `paybus.events` and waits for the broker's confirm.
    pub async fn publish_event(&self, message: &OutgoingMessage) -> Result<(), PublishError> {
        let channel = self.channel();
        let pending = self.send(deadline(), send_event(&channel, message)).await?;
        let result = confirmed(
            EVENTS_EXCHANGE,
            message,
            self.confirmation(pending, deadline()).await?,
        );
        self.renew_if_nacked(&channel, [&result]).await;
        result
    }

    /// After a nack, the next publishes go on a fresh channel (see
    /// [`BrokerLink::renew_publish_channel`]).
    async fn renew_if_nacked<'r>(
        &self,
        channel: &Channel,
        results: impl IntoIterator<Item = &'r Result<(), PublishError>>,
    ) {
        let nacked = results
            .into_iter()
            .any(|result| matches!(result, Err(PublishError::Nacked { .. })));
        if nacked {
            self.link.renew_publish_channel(channel).await;
        }
    }

    /// Publishes all of them before waiting for any confirm (a confirm round trip per message
    /// would cap throughput at ~2.6k/s here; pipelined it is ~17k/s). One result per message,
    /// in order.
    pub async fn publish_events(
        &self,
        messages: &[OutgoingMessage],
    ) -> Vec<Result<(), PublishError>> {
        let channel = self.channel();
        let sending = deadline();
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            pending.push(self.send(sending, send_event(&channel, message)).await);
        }
        let deadline = deadline();
        let mut results = Vec::with_capacity(messages.len());
        for (message, sent) in messages.iter().zip(pending) {
            results.push(match sent {
                Ok(pending) => match self.confirmation(pending, deadline).await {
                    Ok(confirmation) => confirmed(EVENTS_EXCHANGE, message, confirmation),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            });
        }
        self.renew_if_nacked(&channel, &results).await;
        results
    }

    /// Publishes a raw body to any exchange (dead letters, replays) and waits for the confirm.
    pub async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let message_id = properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let channel = self.channel();
        let publish = async {
            Ok(channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    body,
                    properties,
                )
                .await?)
        };
        let pending = self.send(deadline(), publish).await?;
        let result = check(
            exchange,
            routing_key,
            &message_id,
            self.confirmation(pending, deadline()).await?,
        );
        self.renew_if_nacked(&channel, [&result]).await;
        result
    }
}

async fn send_event(
    channel: &Channel,
    message: &OutgoingMessage,
) -> Result<PublisherConfirm, PublishError> {
    Ok(channel
        .basic_publish(
            EVENTS_EXCHANGE.into(),
            message.routing_key.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &message.body,
            properties(message, event_headers(message)),
        )
        .await?)
}

/// An event's headers: its shard key (the envelope's, else the message id), which a sharded
/// function's consistent-hash exchange routes on, and the W3C trace context of its sender.
fn event_headers(message: &OutgoingMessage) -> FieldTable {
    let key = shard_key_of(&message.body).unwrap_or_else(|| message.id.to_string());
    let mut headers = FieldTable::default();
    headers.insert(
        SHARD_KEY_HEADER.into(),
        lapin::types::AMQPValue::LongString(key.into()),
    );
    super::headers::set_trace_headers(&mut headers, &message.trace);
    headers
}

/// AMQP properties of an envelope (docs/bus.md).
pub fn properties(message: &OutgoingMessage, headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(message.id.to_string().as_str().into())
        .with_correlation_id(message.correlation_id.to_string().as_str().into())
        .with_type(message.routing_key.as_str().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(message.occurred_at.timestamp()).unwrap_or_default())
        .with_headers(headers)
}

fn confirmed(
    exchange: &str,
    message: &OutgoingMessage,
    confirmation: Confirmation,
) -> Result<(), PublishError> {
    check(
        exchange,
        &message.routing_key,
        &message.id.to_string(),
        confirmation,
    )
}

fn check(
    exchange: &str,
    routing_key: &str,
    message_id: &str,
    confirmation: Confirmation,
) -> Result<(), PublishError> {
    match confirmation {
        // A mandatory message nobody could route still comes back as an Ack: check both.
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            message_id: message_id.to_owned(),
        }),
        Confirmation::Nack(_) => Err(PublishError::Nacked {
            message_id: message_id.to_owned(),
        }),
    }
}
