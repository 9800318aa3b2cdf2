//! Partners (the payment companies we move money for) and the notifications owed to them.
//!
//! - [`partner`]: the partner row — name, webhook endpoint (and whether a 410 disabled it).
//! - [`webhook_secrets`]: its signing secrets, sealed at rest, rotated with overlap
//!   (write-only: shown once, never returned by a read).
//! - [`attempts`]: one record per POST made to the partner.
//! - [`notifications`]: a notification is written in the same transaction as the transition
//!   that owes it (principle 8), with its `partner.notification.created` message; the
//!   deliver-webhook function claims, POSTs and settles it through the platform's retry kit.
//!
//! Used by the functions that owe notifications (confirm-withdrawal, confirm-deposit), by the
//! one that delivers them, and by the admin API.

pub mod attempts;
pub mod audit;
pub mod breaker;
pub mod notifications;
pub mod partner;
pub mod webhook_secrets;

pub use notifications::{NewNotification, NotificationCreated, NotificationStatus};
pub use partner::{NewPartner, Partner, PartnerError};
