//! What every paybus function shares: typed configuration, the database pool and migrations,
//! the broker connection, and telemetry. Workflow logic never lives here.

pub mod broker;
pub mod bus;
pub mod config;
pub mod db;
pub mod ledger;
pub mod notifications;
pub mod redact;
pub mod signature;
pub mod telemetry;

#[cfg(feature = "test-harness")]
pub mod testing;

pub use config::{ConfigError, Secret, Settings};
