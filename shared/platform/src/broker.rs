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

/// Opens one connection. Recovery after a drop is the bus link's job
/// (`bus::link::BrokerLink`), not lapin's: lapin's auto-recovery sometimes gave up after a
/// clean broker restart, and sometimes finished after we had replaced the connection, leaving
/// a recovered consumer holding prefetched deliveries nobody read. One mechanism, ours.
pub async fn connect(settings: &BrokerSettings) -> Result<Connection, BrokerUnreachable> {
    Connection::connect(settings.url.as_str(), ConnectionProperties::default())
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
