//! The paybus platform: what every function, the API and the command line stand on, naming no
//! workflow table (workflows live in `shared/<domain>` and `functions/<name>`).
//!
//! - configuration: [`config`] ([`Settings`], `Vars`, [`Secret`], `Shards`), [`setting`],
//!   [`secrets`] (`_FROM` references to AWS), [`sealed`] (secrets sealed at rest);
//! - the database: [`db`] (pool, schema), [`migrations`], [`column`], [`transition`];
//! - the bus: [`broker`], [`bus`] (envelope, topology, outbox and relay, consumers, `Handler`
//!   and `Outcome`, dead letters, the Lambda adapter); [`retry`] (`WorkTable`, `RetryPolicy`);
//! - running: [`maintenance`] (jobs and their scheduler), [`runner`], [`function`];
//! - ops: [`audit`], [`auditor`], [`ops_log`], [`approvals`], [`triage`], [`actor`],
//!   [`signature`], [`redact`], [`gauges`]; [`telemetry`]. Layers: docs/architecture.md.

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
pub mod gauges;
pub mod maintenance;
pub mod migrations;
pub mod ops_log;
pub mod redact;
pub mod retry;
pub mod runner;
pub mod sealed;
pub mod secrets;
pub mod setting;
pub mod signature;
pub mod telemetry;
pub mod transition;
pub mod triage;

pub use config::{ConfigError, Secret, Settings};

/// What [`column_enum!`] expands to needs, whatever the calling crate depends on.
#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use strum;
}
