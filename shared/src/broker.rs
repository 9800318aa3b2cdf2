//! The RabbitMQ connection. Topology, publishing and consuming build on this.

use lapin::{Connection, ConnectionProperties};

use crate::config::BrokerSettings;

#[derive(Debug, thiserror::Error)]
#[error("cannot reach the broker at {url}: {source}")]
pub struct BrokerUnreachable {
    pub url: String,
    #[source]
    pub source: lapin::Error,
}

/// Opens a connection that recovers by itself after a broker restart (lapin ≥ 4.12.3
/// restores channels, QoS, topology and consumers).
pub async fn connect(settings: &BrokerSettings) -> Result<Connection, BrokerUnreachable> {
    let properties = ConnectionProperties::default().enable_auto_recover();
    Connection::connect(settings.url.as_str(), properties)
        .await
        .map_err(|source| BrokerUnreachable {
            url: crate::redact::url(&settings.url),
            source,
        })
}

/// One connection attempt, closed again: for health checks, which want the real reason
/// ("connection refused") at once rather than a recovering connection that keeps trying.
pub async fn probe(settings: &BrokerSettings) -> Result<(), BrokerUnreachable> {
    let unreachable = |source| BrokerUnreachable {
        url: crate::redact::url(&settings.url),
        source,
    };
    let connection = Connection::connect(settings.url.as_str(), ConnectionProperties::default())
        .await
        .map_err(unreachable)?;
    connection
        .close(200, "probe done".into())
        .await
        .map_err(unreachable)
}
