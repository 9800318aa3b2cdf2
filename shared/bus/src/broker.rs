//! The RabbitMQ connection. Topology, publishing and consuming build on this.
//!
//! The broker may be one node or the nodes of a cluster (`PAYBUS_AMQP_URL` lists them): a
//! connection goes to the first node that takes it, trying them in turn.

use std::time::Duration;

use lapin::{Connection, ConnectionProperties};
use url::Url;

use paybus_config::BrokerSettings;

/// How long one node may take to accept a connection: a node that hangs (a paused VM, an
/// address that drops packets) must not hold up trying the next one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("cannot reach the broker at {url}: {source}")]
pub struct BrokerUnreachable {
    /// The node (or, when none answered, every node tried), password hidden.
    pub url: String,
    #[source]
    pub source: lapin::Error,
}

impl BrokerUnreachable {
    /// Whether the broker may take the connection later: nothing listening, a reset or a
    /// timeout (a node still starting or restarting), or a node that closed the connection
    /// because it is shutting down. A refusal of the credentials or the vhost is permanent.
    pub fn is_transient(&self) -> bool {
        connection_lost(&self.source)
    }
}

/// Whether `error` says the connection went (nothing listening, a reset, a timeout, a node
/// gone silent past two heartbeats, a node shutting down, a request on a connection already
/// closed) rather than that the broker refused the request (no such queue, other arguments,
/// credentials): the link replaces such a connection, and whoever waits for it may try again.
pub(crate) fn connection_lost(error: &lapin::Error) -> bool {
    use lapin::{
        ErrorKind,
        protocol::{AMQPErrorKind, AMQPHardError},
    };
    match error.kind() {
        ErrorKind::IOError(_)
        | ErrorKind::MissingHeartbeatError
        | ErrorKind::InvalidConnectionState(_) => true,
        ErrorKind::ProtocolError(error) => matches!(
            error.kind(),
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED)
        ),
        _ => false,
    }
}

/// How long the broker may take to answer one request the process waits on (the link's
/// publishing channel opened, a consumer's subscription, a paused consumer cancelled and its
/// channel closed; a stop has a shorter bound, `bus/consumer.rs`, and the whole topology a
/// longer one, `bus/link.rs`). lapin waits for a reply for as long as the connection lives; a
/// node that accepted the request and went silent would hold that task for good.
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// `request`, or a timed-out I/O error after `limit` (a transient failure to the callers that
/// retry).
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    request: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<T, lapin::Error> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result,
        Err(_elapsed) => Err(lapin::Error::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no {what} within {limit:?}"),
        ))),
    }
}

/// The heartbeat a running process's connection asks for when its URL names none
/// (`?heartbeat=N` in `PAYBUS_AMQP_URL` sets another; the broker may lower it). lapin closes a
/// connection that heard nothing for two intervals, and only then does the link move to the
/// next node: a node gone silent (a partition, a hung host) is left after 20 s, where
/// RabbitMQ's default, 60 s, took two minutes. Not in Lambda: an environment frozen between
/// invocations sends no heartbeat, and the broker drops a connection that missed two, so a
/// function idle for 20 s would find its connection gone (its messages then wait for the
/// relay); there the broker's own default stays.
pub const DEFAULT_HEARTBEAT_SECONDS: u16 = 10;

/// `url`, asking for [`DEFAULT_HEARTBEAT_SECONDS`] unless it names a heartbeat of its own or
/// the process is a Lambda environment.
fn with_default_heartbeat(url: &Url, in_lambda: bool) -> Url {
    let mut url = url.clone();
    if !in_lambda && !url.query_pairs().any(|(key, _)| key == "heartbeat") {
        url.query_pairs_mut()
            .append_pair("heartbeat", &DEFAULT_HEARTBEAT_SECONDS.to_string());
    }
    url
}

/// Opens one connection to one node.
pub async fn connect_node(url: &Url) -> Result<Connection, BrokerUnreachable> {
    let asked = with_default_heartbeat(url, paybus_config::in_lambda());
    let attempt = Connection::connect(asked.as_str(), ConnectionProperties::default());
    within(CONNECT_TIMEOUT, "connection", attempt)
        .await
        .map_err(|source| BrokerUnreachable {
            url: paybus_config::redact::url(url),
            source,
        })
}

/// Opens one connection, trying the nodes in turn from node `first` of
/// [`BrokerSettings::urls`] (wrapping around, each node once): the connection and the index of
/// the node that took it. When none does, the error names every node and the last one's cause.
pub async fn connect_from(
    settings: &BrokerSettings,
    first: usize,
) -> Result<(Connection, usize), BrokerUnreachable> {
    let nodes = settings.urls().count();
    let mut last = None;
    for index in (first..first + nodes).map(|i| i % nodes) {
        match connect_node(settings.node(index)).await {
            Ok(connection) => return Ok((connection, index)),
            Err(error) => {
                if nodes > 1 {
                    tracing::warn!(%error, node = index, "broker node unreachable; trying the next");
                }
                last = Some(error.source);
            }
        }
    }
    Err(BrokerUnreachable {
        url: settings.redacted(),
        source: last.unwrap_or_else(|| lapin::Error::from(std::io::Error::other("no broker URL"))),
    })
}

/// Opens one connection to the first node that takes it. Recovery after a drop is the bus
/// link's job (`bus::link::BrokerLink`), not lapin's: lapin's auto-recovery sometimes gave up
/// after a clean broker restart, and sometimes finished after we had replaced the connection,
/// leaving a recovered consumer holding prefetched deliveries nobody read. One mechanism, ours.
pub async fn connect(settings: &BrokerSettings) -> Result<Connection, BrokerUnreachable> {
    connect_from(settings, 0)
        .await
        .map(|(connection, _)| connection)
}

/// What [`probe`] found the broker doing with publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publishing {
    /// It takes them.
    Open,
    /// A resource alarm blocks every connection that publishes: the broker's reason (`low on
    /// memory`, `low on disk`, `low on disk & memory`) and the node asked (password hidden).
    Blocked { reason: String, node: String },
}

/// The probe's publish goes to the default exchange under this routing key, which names no
/// queue: the broker drops the message. (Not `paybus.events`: its alternate exchange would turn
/// the probe into an `unroutable` dead letter.)
const PROBE_ROUTING_KEY: &str = "paybus.probe.nowhere";

/// One connection attempt that publishes one message to nowhere and closes again: for health
/// checks, which want the real reason ("connection refused", "low on disk") at once rather than
/// a recovering connection that keeps trying. With several nodes, the broker is reachable when
/// one of them is; a resource alarm on any node blocks publishers on all of them.
///
/// Why publish: RabbitMQ tells a connection of an alarm only once it publishes. Measured on
/// RabbitMQ 3.10.8 under a memory alarm: a fresh connection heard nothing in 3 s (nor did one
/// opened before the alarm), and could still open a channel and declare; its first publish
/// brought `connection.blocked` within a millisecond. The publisher confirm proves nothing (an
/// unroutable message was confirmed under a disk alarm), so the probe asks for the close: the
/// broker answers it only if it read on past the publish, which it does not on a connection it
/// blocks (nor does lapin write anything more on one).
pub async fn probe(settings: &BrokerSettings) -> Result<Publishing, BrokerUnreachable> {
    use futures_util::StreamExt;
    use lapin::{BasicProperties, Event, options::BasicPublishOptions};

    let (connection, index) = connect_from(settings, 0).await?;
    let node = paybus_config::redact::url(settings.node(index));
    let mut notices = connection.events_listener();
    let blocked = async {
        while let Some(notice) = notices.next().await {
            if let Event::ConnectionBlocked(reason) = notice {
                return reason;
            }
        }
        std::future::pending().await
    };
    let published_and_closed = within(REPLY_TIMEOUT, "probe publish and close", async {
        let channel = connection.create_channel().await?;
        channel
            .basic_publish(
                "".into(),
                PROBE_ROUTING_KEY.into(),
                BasicPublishOptions::default(),
                b"",
                BasicProperties::default(),
            )
            .await?;
        connection.close(200, "probe done".into()).await
    });
    // A blocked connection is left to the process's end: lapin would not send its close.
    tokio::select! {
        biased;
        reason = blocked => Ok(Publishing::Blocked { reason, node }),
        closed = published_and_closed => match closed {
            Ok(()) => Ok(Publishing::Open),
            Err(source) => Err(BrokerUnreachable { url: node, source }),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use url::Url;

    use super::{BrokerUnreachable, with_default_heartbeat, within};

    #[test]
    fn a_url_without_a_heartbeat_asks_for_the_default_and_one_with_keeps_its_own() {
        let bare = Url::parse("amqp://u:p@10.0.0.1:5672/%2f").unwrap();
        assert_eq!(
            with_default_heartbeat(&bare, false).as_str(),
            "amqp://u:p@10.0.0.1:5672/%2f?heartbeat=10"
        );
        let tuned = Url::parse("amqp://u:p@10.0.0.1:5672/%2f?frame_max=8192&heartbeat=3").unwrap();
        assert_eq!(with_default_heartbeat(&tuned, false), tuned);
        let other = Url::parse("amqp://u:p@10.0.0.1:5672/%2f?frame_max=8192").unwrap();
        assert_eq!(
            with_default_heartbeat(&other, false).as_str(),
            "amqp://u:p@10.0.0.1:5672/%2f?frame_max=8192&heartbeat=10"
        );
    }

    #[test]
    fn a_lambda_environment_keeps_the_broker_s_heartbeat() {
        let bare = Url::parse("amqps://u:p@b-1.mq.eu-west-1.amazonaws.com:5671/%2f").unwrap();
        assert_eq!(with_default_heartbeat(&bare, true), bare);
    }

    #[tokio::test]
    async fn a_request_that_gets_no_reply_fails_as_a_transient_timeout() {
        let silent = std::future::pending::<Result<(), lapin::Error>>();
        let error = within(Duration::from_millis(20), "consumer cancelled", silent)
            .await
            .expect_err("a request with no reply ends at its bound");
        assert!(
            error
                .to_string()
                .contains("no consumer cancelled within 20ms"),
            "{error}"
        );
        // The link's watchdog retries what is transient: a silent node must be retried, not
        // taken for a refusal of the credentials.
        let unreachable = BrokerUnreachable {
            url: "amqp://broker".to_owned(),
            source: error,
        };
        assert!(unreachable.is_transient());
    }

    #[tokio::test]
    async fn a_request_answered_in_time_is_passed_through() {
        let answered = async { Ok::<_, lapin::Error>(7) };
        assert_eq!(
            within(Duration::from_secs(5), "reply", answered)
                .await
                .expect("answered"),
            7
        );
    }
}
