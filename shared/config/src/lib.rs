//! Configuration and secret material, read once at start-up and passed down; it depends on no
//! other paybus crate.
//!
//! - [`Settings`]: the typed `PAYBUS_*` settings, with [`Vars`] (the one resolved environment)
//!   and [`Shards`] (the queue layout); [`setting`] documents one variable.
//! - [`secrets`]: `_FROM` references resolved from AWS at start-up; [`sealed`]: secrets sealed
//!   at rest; [`Secret`]: a value that never prints.
//! - [`signature`]: HMAC-signed webhooks, both directions; [`redact`]: credentials out of logs.
//! - [`build`]: the release and the commit this binary was built from.

mod settings;

pub mod build;
pub mod redact;
pub mod sealed;
pub mod secrets;
pub mod setting;
pub mod signature;

pub use settings::*;
