//! Partners (the payment companies we move money for) and the notifications owed to them.
//!
//! - [`partner`]: the partner row — name, webhook endpoint and its signing secret (write-only:
//!   never returned by a read).
//! - [`notifications`]: a notification is written in the same transaction as the transition
//!   that owes it (principle 8), with its `partner.notification.created` message; the
//!   deliver-webhook function claims, POSTs and settles it through the platform's retry kit.
//!
//! Used by the functions that owe notifications (confirm-withdrawal, confirm-deposit), by the
//! one that delivers them, and by the admin API.

pub mod breaker;
pub mod notifications;
pub mod partner;

pub use notifications::{NewNotification, NotificationCreated, NotificationStatus};
pub use partner::{NewPartner, Partner, PartnerError};

#[cfg(feature = "test-harness")]
pub mod testing;
