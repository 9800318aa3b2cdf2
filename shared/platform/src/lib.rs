//! The paybus platform: typed configuration, the database pool and migrations, the bus
//! runtime (envelope, outbox, consumers, dead letters, Lambda adapter, sweeper), the
//! row-backed retry kit, the audit framework, the ops log and telemetry. It names no workflow table:
//! workflows live in their domain crates (`shared/<domain>`) and functions (`functions/<name>`).

// `column_enum!` names this crate by its path, as every crate using it does.
extern crate self as paybus_platform;

pub mod actor;
pub mod approvals;
pub mod audit;
pub mod auditor;
pub mod broker;
pub mod bus;
pub mod column;
pub mod config;
pub mod db;
pub mod function;
pub mod ops_log;
pub mod redact;
pub mod retry;
pub mod sealed;
pub mod secrets;
pub mod setting;
pub mod signature;
pub mod telemetry;
pub mod transition;
pub mod triage;

#[cfg(feature = "test-harness")]
pub mod testing;

pub use config::{ConfigError, Secret, Settings};

/// What [`column_enum!`] expands to needs, whatever the calling crate depends on.
#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use strum;
}
