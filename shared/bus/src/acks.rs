//! Acknowledging a channel's deliveries in runs: one `basic.ack multiple` for every delivery
//! settled up to a tag, instead of one `basic.ack` each.
//!
//! Why: a quorum queue turns every ack frame into a Raft command written to its log. In the W2
//! benchmark, with the broker and the database sharing two cores, acking in runs takes the
//! broker's CPU per message from a median of 207 µs to 145 µs, and the client's from 160 µs to
//! 105 µs (docs/benchmarks.md).
//!
//! The invariant: `multiple` is sent only for a tag below which nothing is still being
//! processed or waiting out a requeue pause. While a delivery waits out its pause, and once a
//! quarter of the channel's prefetch is held back behind a slow one (a webhook to a partner
//! that never answers), the others are acked one by one: held-back deliveries keep their
//! prefetch slots, and a full window would make another partner's webhooks wait seconds.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use lapin::{
    Acker,
    options::{BasicAckOptions, BasicRejectOptions},
};
use tokio::sync::Mutex;

/// One channel's window, shared by its batches in flight. The lock is held while the acks go
/// out, so they reach the broker in the order the window decided them (a `multiple` ack
/// overtaken by a later one would name a tag already acked, and the broker would close the
/// channel).
#[derive(Clone)]
pub(super) struct ChannelAcks {
    window: Arc<Mutex<AckWindow<Acker>>>,
}

impl ChannelAcks {
    /// The window of a channel whose prefetch is `prefetch`.
    pub(super) fn new(prefetch: u16) -> Self {
        Self {
            window: Arc::new(Mutex::new(AckWindow::new(hold_limit(prefetch)))),
        }
    }

    /// Acks `deliveries` (processed), together with whatever run they complete.
    pub(super) async fn processed(&self, function: &str, deliveries: Vec<(Tag, Acker)>) {
        let mut window = self.window.lock().await;
        for (tag, acker) in deliveries {
            window.processed(tag, acker);
        }
        send_due(&mut window, function).await;
    }

    /// `tag` waits out a requeue pause: the deliveries behind it are acked one by one meanwhile.
    pub(super) async fn pausing(&self, function: &str, tag: Tag) {
        let mut window = self.window.lock().await;
        window.pausing(tag);
        send_due(&mut window, function).await;
    }

    /// Rejects `tag` back to the queue (the broker counts it towards the delivery limit).
    pub(super) async fn requeue(&self, function: &str, tag: Tag, acker: Acker) {
        let mut window = self.window.lock().await;
        // `reject` (not `nack`) so the requeue counts towards the delivery limit on every
        // RabbitMQ version (4.3 stopped counting nacks).
        let rejected = acker.reject(BasicRejectOptions { requeue: true }).await;
        window.rejected(tag);
        unsettled(function, tag, "reject", rejected);
        send_due(&mut window, function).await;
    }
}

async fn send_due(window: &mut AckWindow<Acker>, function: &str) {
    for ack in window.due() {
        let (tag, acker, multiple) = match ack {
            Ack::UpTo(tag, acker) => (tag, acker, true),
            Ack::One(tag, acker) => (tag, acker, false),
        };
        let sent = acker.ack(BasicAckOptions { multiple }).await;
        unsettled(function, tag, "ack", sent);
    }
}

/// Logs a settlement the channel could not take: the broker redelivers the delivery (and any
/// a `multiple` ack covered), handlers are idempotent.
fn unsettled(function: &str, tag: Tag, what: &str, result: lapin::Result<bool>) {
    if !matches!(result, Ok(true)) {
        tracing::warn!(
            function,
            delivery_tag = tag,
            what,
            "could not settle delivery (channel closed); the broker will redeliver it"
        );
    }
}

/// How many processed deliveries may wait for an earlier one before they are acked one by one:
/// a quarter of the prefetch, so a slow delivery never holds more than that.
fn hold_limit(prefetch: u16) -> usize {
    usize::from(prefetch / 4).max(1)
}

/// A channel's delivery tags start at 1 and grow by one per delivery.
pub(super) type Tag = u64;

/// What to send, in this order, after a change to the window. `A` is the delivery's acker.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ack<A> {
    /// `basic.ack` with `multiple`: this delivery and every unacked one before it.
    UpTo(Tag, A),
    /// `basic.ack` of this delivery alone.
    One(Tag, A),
}

/// The settled-but-unacked deliveries of one channel.
#[derive(Debug)]
pub(super) struct AckWindow<A> {
    /// The lowest tag not yet acked or rejected: everything below is settled with the broker.
    next: Tag,
    /// Processed, to be acked.
    ready: BTreeMap<Tag, A>,
    /// Acked alone or rejected: settled, but above `next`.
    settled: BTreeSet<Tag>,
    /// Waiting out a requeue pause before their reject.
    pausing: BTreeSet<Tag>,
    /// Processed deliveries held back by an earlier one, at most (see `hold_limit`).
    hold_limit: usize,
}

impl<A> AckWindow<A> {
    pub(super) fn new(hold_limit: usize) -> Self {
        Self {
            next: 1,
            ready: BTreeMap::new(),
            settled: BTreeSet::new(),
            pausing: BTreeSet::new(),
            hold_limit: hold_limit.max(1),
        }
    }

    /// The delivery `tag` is processed (its transaction committed, or its dead letter was
    /// confirmed) and may be acked.
    pub(super) fn processed(&mut self, tag: Tag, acker: A) {
        self.ready.insert(tag, acker);
    }

    /// The delivery `tag` waits out a pause before it is rejected back to the queue.
    pub(super) fn pausing(&mut self, tag: Tag) {
        self.pausing.insert(tag);
    }

    /// The delivery `tag` was rejected (or could not be settled at all).
    pub(super) fn rejected(&mut self, tag: Tag) {
        self.pausing.remove(&tag);
        self.settled.insert(tag);
    }

    /// The acks to send now, in order; the window assumes they are sent.
    pub(super) fn due(&mut self) -> Vec<Ack<A>> {
        let mut due = Vec::new();
        let mut up_to = None;
        loop {
            if let Some(acker) = self.ready.remove(&self.next) {
                up_to = Some(Ack::UpTo(self.next, acker));
            } else if !self.settled.remove(&self.next) {
                break;
            }
            self.next += 1;
        }
        due.extend(up_to);
        if !self.pausing.is_empty() || self.ready.len() >= self.hold_limit {
            for (tag, acker) in std::mem::take(&mut self.ready) {
                self.settled.insert(tag);
                due.push(Ack::One(tag, acker));
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::{Ack, AckWindow, hold_limit};

    fn processed(window: &mut AckWindow<()>, tags: std::ops::RangeInclusive<u64>) {
        for tag in tags {
            window.processed(tag, ());
        }
    }

    #[test]
    fn a_batch_settled_in_order_is_acked_with_one_frame() {
        let mut window = AckWindow::new(32);
        processed(&mut window, 1..=16);
        assert_eq!(window.due(), vec![Ack::UpTo(16, ())]);
        assert_eq!(window.due(), vec![]);
    }

    #[test]
    fn a_later_batch_waits_for_the_earlier_one_still_in_its_transaction() {
        let mut window = AckWindow::new(32);
        processed(&mut window, 17..=32);
        assert_eq!(window.due(), vec![], "1..=16 are still being processed");
        processed(&mut window, 1..=16);
        assert_eq!(window.due(), vec![Ack::UpTo(32, ())]);
        processed(&mut window, 33..=33);
        assert_eq!(window.due(), vec![Ack::UpTo(33, ())]);
    }

    #[test]
    fn a_delivery_in_its_requeue_pause_is_never_covered_and_holds_nothing_back() {
        let mut window = AckWindow::new(32);
        window.pausing(5);
        processed(&mut window, 1..=4);
        processed(&mut window, 6..=7);
        assert_eq!(
            window.due(),
            vec![Ack::UpTo(4, ()), Ack::One(6, ()), Ack::One(7, ())],
            "6 and 7 must not wait for 5's pause, and no multiple ack may reach 5"
        );
        processed(&mut window, 9..=9);
        assert_eq!(window.due(), vec![Ack::One(9, ())]);
        window.rejected(5);
        assert_eq!(
            window.due(),
            vec![],
            "nothing new to ack; 5..=7 are settled"
        );
        processed(&mut window, 8..=8);
        assert_eq!(
            window.due(),
            vec![Ack::UpTo(8, ())],
            "8 is acked, and the run moves on past the already acked 9"
        );
        processed(&mut window, 10..=10);
        assert_eq!(window.due(), vec![Ack::UpTo(10, ())]);
    }

    #[test]
    fn a_rejected_delivery_ends_no_run_by_itself() {
        let mut window = AckWindow::new(32);
        window.pausing(2);
        window.rejected(2);
        processed(&mut window, 1..=1);
        processed(&mut window, 3..=3);
        assert_eq!(window.due(), vec![Ack::UpTo(3, ())]);
    }

    #[test]
    fn deliveries_held_back_by_a_slow_one_are_acked_alone_once_they_reach_the_limit() {
        let mut window = AckWindow::new(4);
        processed(&mut window, 2..=4);
        assert_eq!(
            window.due(),
            vec![],
            "1 is still being processed; 3 held back"
        );
        processed(&mut window, 5..=5);
        assert_eq!(
            window.due(),
            vec![
                Ack::One(2, ()),
                Ack::One(3, ()),
                Ack::One(4, ()),
                Ack::One(5, ())
            ],
            "a slow 1 must not keep the prefetch slots of the ones behind it"
        );
        processed(&mut window, 6..=6);
        assert_eq!(window.due(), vec![], "held again, below the limit");
        processed(&mut window, 1..=1);
        assert_eq!(
            window.due(),
            vec![Ack::UpTo(6, ())],
            "the run moves past the ones acked alone"
        );
    }

    #[test]
    fn the_hold_limit_is_a_quarter_of_the_prefetch_and_at_least_one() {
        assert_eq!(hold_limit(128), 32);
        assert_eq!(hold_limit(64), 16);
        assert_eq!(hold_limit(1), 1);
        assert_eq!(hold_limit(0), 1);
    }
}
