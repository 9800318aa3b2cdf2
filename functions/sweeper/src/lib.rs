//! Every workflow's maintenance jobs (due retries, reapers, expiry), in one list that the
//! scheduled sweeper Lambda and `paybus run` both read. The outbox relay is added by the
//! runtime itself (`paybus_platform::bus::runner::outbox_relay_job`).

use std::sync::Arc;

use paybus_platform::bus::{Services, sweeper::Job};

pub fn jobs(services: &Services) -> Vec<Arc<dyn Job>> {
    // W2: re-publish partner notifications whose retry is due.
    paybus_deliver_webhook::jobs(services)
}
