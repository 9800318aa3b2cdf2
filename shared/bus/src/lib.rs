//! The bus runtime every function uses: envelope, topology, confirmed publishing, the
//! transactional outbox and its relay, the consumer runtime with outcomes, dead letters, the
//! Lambda adapter, the sweeper and the all-in-one runner.

mod acks;
pub mod activity;
pub mod broker;
pub mod consumer;
pub mod dead_letter;
pub mod delivery;
mod envelope;
pub mod gauges;
pub mod handler;
pub mod headers;
pub mod held;
pub mod link;
pub mod metrics;
pub mod outbox;
pub mod pauses;
mod published_marks;
pub mod publisher;
pub mod samples;
pub mod services;
pub mod skips;
pub mod topology;
pub mod transition;

pub use envelope::{Envelope, Message, OutgoingMessage};
pub use handler::{Batched, Context, Handler, HandlerError, Outcome};
pub use outbox::{Outbox, UnitOfWork};
pub use services::{Services, StartupError, shutdown_on_signal};
