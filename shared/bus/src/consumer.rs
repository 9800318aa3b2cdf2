//! The local transport: a lapin consumer per function queue.
//!
//! Semantics (also in the README): a delivery is acked only after its handler's transaction
//! committed, or after its dead letter was confirmed by the broker (the acks go out in runs:
//! `bus/acks.rs`); prefetch bounds how many are in flight; an infrastructure error requeues it
//! after a back-off pause. SIGTERM (the shutdown token) stops taking deliveries, lets in-flight
//! ones finish (a WARN every 10 s says how many it still waits for), then returns. A paused
//! function (`bus/pauses.rs`) stops taking deliveries the same way and subscribes again on
//! resume.

use std::{collections::VecDeque, panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures_util::{FutureExt, StreamExt, future::join_all};
use lapin::{
    Acker, Channel, Connection, Consumer,
    message::Delivery,
    options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions},
    types::{AMQPValue, FieldTable},
};
use tokio::sync::{Semaphore, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    acks::{ChannelAcks, Tag},
    dead_letter,
    delivery::{Disposition, IncomingDelivery, Processor},
    link::BrokerLink,
    pauses::PauseWatch,
    publisher::Publisher,
    topology::SHARD_KEY_HEADER,
};
use crate::broker::{REPLY_TIMEOUT, connection_lost, within};

/// Consumes `processor.queue()` until `shutdown` is cancelled, then drains in-flight work.
/// Follows the link: when it replaces the connection, consuming resumes on the new one. While
/// `pauses` says the processor's function is paused, it does not consume.
pub async fn consume<P: Processor>(
    link: &BrokerLink,
    processor: Arc<P>,
    publisher: Publisher,
    prefetch: u16,
    mut pauses: PauseWatch,
    shutdown: CancellationToken,
) -> Result<(), lapin::Error> {
    let in_flight = TaskTracker::new();
    let mut generation = link.generation();
    let mut first = true;
    loop {
        let function = processor.function().to_owned();
        if pauses.is_paused(&function) {
            tracing::warn!(function, queue = %processor.queue(), "paused by ops: not consuming");
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = pauses.until(&function, false) => {}
            }
            tracing::info!(function, "resumed by ops");
            continue;
        }
        let live = link.current();
        generation.borrow_and_update();
        let subscribed = consume_on(
            &live.connection,
            &processor,
            &publisher,
            prefetch,
            Ending {
                shutdown: &shutdown,
                generation: &mut generation,
                pauses: &mut pauses,
                function: &function,
            },
            &in_flight,
        )
        .await;
        match subscribed {
            Ok(Ended::Shutdown) => break,
            Ok(Ended::ConnectionReplaced | Ended::Paused) => {}
            // The first subscription refused by the broker is a configuration error (no such
            // queue, other arguments): fail loudly. A lost connection, or a later failure,
            // is an outage: wait for the link.
            Err(error) if first && !connection_lost(&error) => return Err(error),
            Err(error) => {
                tracing::warn!(function = processor.function(), %error, "cannot consume yet; waiting for the broker link");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = generation.changed() => {}
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
        first = false;
    }
    in_flight.close();
    settle_in_flight(&in_flight, processor.function()).await;
    tracing::info!(
        function = processor.function(),
        "consumer stopped; in-flight deliveries finished"
    );
    Ok(())
}

enum Ended {
    Shutdown,
    ConnectionReplaced,
    Paused,
}

/// What ends a subscription: the process stopping, the link replacing the connection, or ops
/// pausing the function.
struct Ending<'a> {
    shutdown: &'a CancellationToken,
    generation: &'a mut watch::Receiver<u64>,
    pauses: &'a mut PauseWatch,
    function: &'a str,
}

impl Ending<'_> {
    async fn next(&mut self) -> Ended {
        tokio::select! {
            () = self.shutdown.cancelled() => Ended::Shutdown,
            _ = self.generation.changed() => Ended::ConnectionReplaced,
            () = self.pauses.until(self.function, true) => Ended::Paused,
        }
    }

    /// What ends a subscription still being made: the process stopping, or the link replacing
    /// the connection it is made on.
    async fn interrupted(&mut self) -> Ended {
        tokio::select! {
            () = self.shutdown.cancelled() => Ended::Shutdown,
            _ = self.generation.changed() => Ended::ConnectionReplaced,
        }
    }
}

/// A channel with its prefetch window, consuming `queue` as `tag`.
async fn subscribe(
    connection: &Connection,
    queue: &str,
    window: u16,
    tag: &str,
) -> Result<(Channel, Consumer), lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(window, BasicQosOptions::default())
        .await?;
    let deliveries = channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((channel, deliveries))
}

async fn consume_on<P: Processor>(
    connection: &Connection,
    processor: &Arc<P>,
    publisher: &Publisher,
    prefetch: u16,
    mut ending: Ending<'_>,
    in_flight: &TaskTracker,
) -> Result<Ended, lapin::Error> {
    let max_batch = processor.max_batch().max(1);
    let window = channel_prefetch(prefetch, max_batch);
    let tag = format!("{}-{}", processor.function(), uuid::Uuid::new_v4().simple());
    // lapin waits for the broker's replies for as long as the connection lives, and a node
    // that went silent keeps it alive until its heartbeat fails: a stop, or the link's new
    // connection, must not wait on that. A pause waits for the subscription, then ends it
    // below with a cancel, so that no channel is left holding prefetched deliveries.
    let queue = processor.queue();
    let subscribing = within(
        REPLY_TIMEOUT,
        "subscription",
        subscribe(connection, queue.as_str(), window, &tag),
    );
    let (channel, mut deliveries) = tokio::select! {
        ended = ending.interrupted() => return Ok(ended),
        subscribed = subscribing => subscribed?,
    };
    let batches = Arc::new(Semaphore::new(batches_in_flight(prefetch, max_batch)));
    let acks = ChannelAcks::new(window);
    let mut held = VecDeque::new();
    tracing::info!(function = processor.function(), queue = %processor.queue(), prefetch, max_batch, "consuming");
    let ended = loop {
        let slot = tokio::select! {
            ended = ending.next() => break ended,
            slot = batches.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_closed) => break Ended::Shutdown,
            },
        };
        let first = match held.pop_front() {
            Some(delivery) => delivery,
            None => tokio::select! {
                ended = ending.next() => break ended,
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => delivery,
                    Some(Err(error)) => {
                        // A connection drop surfaces here; lapin usually recovers the channel
                        // and the consumer on this stream, else the link replaces the
                        // connection.
                        tracing::warn!(function = processor.function(), %error, "consumer interrupted; waiting for recovery");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    // The consumer is gone for good (cancelled by the broker, channel closed).
                    None => break ending.next().await,
                }
            },
        };
        let batch = take_batch(
            || buffered(&mut deliveries),
            &mut held,
            first,
            max_batch,
            entity_of,
        );
        let processor = processor.clone();
        let publisher = publisher.clone();
        let acks = acks.clone();
        in_flight.spawn(async move {
            settle(&*processor, &publisher, &acks, batch).await;
            drop(slot);
        });
    };
    if let Some(reply_within) = ended.goodbye_within() {
        let _ = within(
            reply_within,
            "consumer cancelled",
            channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await;
        // Let in-flight deliveries settle on this channel before it closes; prefetched
        // ones never started (the held ones among them) go back to the queue with the
        // channel.
        in_flight.close();
        settle_in_flight(in_flight, processor.function()).await;
        let _ = within(
            reply_within,
            "channel closed",
            channel.close(200, "stopped consuming".into()),
        )
        .await;
    }
    Ok(ended)
}

/// How long a stopping process waits for each of the broker's replies to its cancel and its
/// channel's close. Both are courtesy: the process's connection closes next, and the
/// deliveries it still holds go back to the queue with it, as after a kill. A node gone silent
/// costs a stop twice this, not twice [`REPLY_TIMEOUT`].
const STOP_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

impl Ended {
    /// How long to wait for each reply when ending the subscription cleanly (cancel, then
    /// close the channel); `None`: the connection is gone, nothing to end.
    fn goodbye_within(&self) -> Option<Duration> {
        match self {
            Ended::Shutdown => Some(STOP_REPLY_TIMEOUT),
            // The process goes on: the prefetched deliveries must go back to the queue now,
            // not when the connection closes.
            Ended::Paused => Some(REPLY_TIMEOUT),
            Ended::ConnectionReplaced => None,
        }
    }
}

/// How often a stopping consumer says what it still waits for.
const SETTLE_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Waits for `in_flight` (closed by the caller) to finish, with a warning every
/// [`SETTLE_REPORT_EVERY`] naming how many deliveries of `function` are still being handled.
/// A stop or a pause waits on a handler stuck in a call (a database whose connection went
/// silent has no timeout of its own), and the warnings say what it waits for. Handlers are not
/// cut off: each call's own timeout ends them, and a process supervisor's kill is safe anyway
/// (an uncommitted transaction rolls back, an unacked delivery comes again).
async fn settle_in_flight(in_flight: &TaskTracker, function: &str) {
    wait_reporting(in_flight, SETTLE_REPORT_EVERY, |still, waited| {
        tracing::warn!(
            function,
            still_in_flight = still,
            waited_seconds = waited.as_secs(),
            "stopping: waiting for in-flight deliveries to finish"
        );
    })
    .await;
}

/// Waits for `tracker`'s tasks, calling `report(tasks still running, time waited)` every
/// `every` until they are done.
async fn wait_reporting(
    tracker: &TaskTracker,
    every: Duration,
    mut report: impl FnMut(usize, Duration),
) {
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval_at(started + every, every);
    // A starved runtime catching up would otherwise fire a burst of identical warnings.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let done = tracker.wait();
    tokio::pin!(done);
    loop {
        tokio::select! {
            // Finished handlers win over a tick due at the same moment: no report of none.
            biased;
            () = &mut done => return,
            _ = ticks.tick() => report(tracker.len(), started.elapsed()),
        }
    }
}

/// How many batches a consumer processes at once. A handler that takes one message at a time
/// gets one slot per prefetched delivery. A batching handler gets `prefetch / max_batch`
/// slots: when they are all busy the broker's deliveries wait in the buffer, so the next batch
/// is a full one. Without the bound every delivery would start its own transaction the moment
/// it arrived, batches would stay at one or two messages, and 64 small transactions would
/// fight over two cores (the W2 benchmark's broker phase runs at 0.6x direct that way).
fn batches_in_flight(prefetch: u16, max_batch: usize) -> usize {
    usize::from(prefetch.max(1)).div_ceil(max_batch).max(1)
}

/// What the broker may hand a consumer ahead of its acks. A batching handler is allowed twice
/// its `prefetch`: a round of full batches in flight and the next round already delivered.
/// With exactly `prefetch`, a finished batch's acks would be what lets the broker send more,
/// so the slot it freed would start on the first one or two messages to arrive (the W2
/// benchmark's broker phase then forms batches of about 11 of 16 and runs at 0.6x direct).
fn channel_prefetch(prefetch: u16, max_batch: usize) -> u16 {
    if max_batch > 1 {
        prefetch.saturating_mul(2)
    } else {
        prefetch
    }
}

/// `first`, then the `held` deliveries and those `next` has at hand (the broker has already
/// handed them over), up to `max`: a batch never waits for more to arrive.
///
/// A full batch does not end inside a run of deliveries about one entity (`entity`, the
/// envelope's shard key): the run is held back, with the delivery that continues it, to
/// start the next batch. Why: two batches in flight that hold one withdrawal each lock it,
/// and the later one waits for the earlier one's commit. With every confirmation sent twice
/// (the W2 benchmark), batches that split a pair wait for the one before nearly every time:
/// 0.8 row-lock waits per transaction through the broker, against none direct, where the
/// batches never split a pair. A delivery taken to look at it and not used is held, never
/// lost.
fn take_batch<D>(
    mut next: impl FnMut() -> Option<D>,
    held: &mut VecDeque<D>,
    first: D,
    max: usize,
    entity: impl Fn(&D) -> Option<&[u8]>,
) -> Vec<D> {
    let mut next = || held.pop_front().or_else(&mut next);
    let mut batch = vec![first];
    while batch.len() < max {
        match next() {
            Some(delivery) => batch.push(delivery),
            None => return batch,
        }
    }
    if max <= 1 {
        return batch;
    }
    let Some(after) = next() else {
        return batch;
    };
    let run = match entity(&after) {
        Some(key) => batch
            .iter()
            .rev()
            .take_while(|delivery| entity(delivery) == Some(key))
            .count(),
        None => 0,
    };
    held.push_front(after);
    // A run longer than a batch is split where it must be.
    if run < batch.len() {
        for delivery in batch.drain(batch.len() - run..).rev() {
            held.push_front(delivery);
        }
    }
    batch
}

/// The next delivery the consumer already has, if any. A stream error or end met here is
/// left for the main loop's next poll, which sees it again.
fn buffered(deliveries: &mut lapin::Consumer) -> Option<Delivery> {
    match deliveries.next().now_or_never()? {
        Some(Ok(delivery)) => Some(delivery),
        Some(Err(error)) => {
            tracing::warn!(%error, "consumer interrupted while taking a batch");
            None
        }
        None => None,
    }
}

/// The entity a delivery is about: its `x-paybus-shard-key` header, which the publisher sets
/// on every event (the envelope's shard key, else the message id).
fn entity_of(delivery: &Delivery) -> Option<&[u8]> {
    match delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(SHARD_KEY_HEADER)?
    {
        AMQPValue::LongString(key) => Some(key.as_bytes()),
        _ => None,
    }
}

/// Processes the deliveries (as a batch when there are several) and settles each: the
/// processed ones with one ack for the batch, dead letters and requeues on their own.
async fn settle<P: Processor>(
    processor: &P,
    publisher: &Publisher,
    acks: &ChannelAcks,
    batch: Vec<Delivery>,
) {
    let (ackers, incoming): (Vec<(Tag, Acker)>, Vec<IncomingDelivery>) = batch
        .into_iter()
        .map(|delivery| {
            (
                (delivery.delivery_tag, delivery.acker),
                IncomingDelivery {
                    body: delivery.data,
                    routing_key: delivery.routing_key.to_string(),
                    properties: delivery.properties,
                },
            )
        })
        .unzip();
    let processing = AssertUnwindSafe(async {
        if let [single] = &incoming[..] {
            vec![processor.process(single).await]
        } else {
            processor.process_batch(&incoming).await
        }
    });
    let dispositions = match processing.catch_unwind().await {
        Ok(dispositions) => dispositions,
        // A handler bug must not leave its deliveries unsettled: acks go out in runs, so one
        // delivery never settled would hold back every later ack on the channel until the
        // prefetch window is full and the consumer stalls. They go back to the queue after
        // the usual pause; one that always panics reaches the delivery limit and is
        // dead-lettered.
        Err(panic) => {
            let message = panic_message(panic.as_ref());
            tracing::error!(function = processor.function(), %message, deliveries = incoming.len(), "handler panicked; requeueing its deliveries");
            incoming
                .iter()
                .map(|delivery| Disposition::Requeue {
                    after: delivery.requeue_after(),
                    error: format!("handler panicked: {message}"),
                })
                .collect()
        }
    };
    let mut processed = Vec::with_capacity(ackers.len());
    let mut others = Vec::new();
    for ((acker, incoming), disposition) in ackers.into_iter().zip(&incoming).zip(dispositions) {
        match disposition {
            Disposition::Ack => processed.push(acker),
            other => others.push((acker, incoming, other)),
        }
    }
    acks.processed(processor.function(), processed).await;
    // Concurrently: one delivery's requeue pause must not hold back the others' settling.
    join_all(others.into_iter().map(|(acker, incoming, disposition)| {
        settle_alone(processor, publisher, acks, acker, incoming, disposition)
    }))
    .await;
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// A delivery that was not simply processed: dead-lettered, then acked once the dead letter
/// is confirmed; or requeued after its pause.
async fn settle_alone<P: Processor>(
    processor: &P,
    publisher: &Publisher,
    acks: &ChannelAcks,
    (tag, acker): (Tag, Acker),
    incoming: &IncomingDelivery,
    disposition: Disposition,
) {
    let requeue = match disposition {
        Disposition::Ack => None,
        Disposition::DeadLetter(dead) => {
            match dead_letter::publish(publisher, processor.function(), incoming, &dead).await {
                Ok(()) => None,
                Err(error) => Some((
                    incoming.requeue_after(),
                    format!("dead letter not confirmed: {error}"),
                )),
            }
        }
        Disposition::Requeue { after, error } => Some((after, error)),
    };
    match requeue {
        None => {
            acks.processed(processor.function(), vec![(tag, acker)])
                .await
        }
        Some((after, error)) => {
            tracing::debug!(function = processor.function(), ?after, %error, message_id = incoming.message_id().unwrap_or_default(), "requeue after pause");
            acks.pausing(processor.function(), tag).await;
            tokio::time::sleep(after).await;
            acks.requeue(processor.function(), tag, acker).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::{batches_in_flight, channel_prefetch, take_batch, wait_reporting};

    /// Deliveries as (tag, entity); `taken` is what a batch took, `held` what waits.
    fn batch_of(
        buffered: &[(u64, &'static str)],
        held: &mut VecDeque<(u64, &'static str)>,
        max: usize,
    ) -> Vec<u64> {
        let mut rest = buffered.iter().copied();
        let first = held
            .pop_front()
            .or_else(|| rest.next())
            .expect("a first delivery");
        let batch = take_batch(|| rest.next(), held, first, max, |d| Some(d.1.as_bytes()));
        assert_eq!(
            rest.next(),
            None,
            "test input longer than one batch's look-ahead"
        );
        batch.into_iter().map(|(tag, _)| tag).collect()
    }

    #[test]
    fn a_full_batch_holds_back_the_run_of_the_entity_that_continues_after_it() {
        let pairs = [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")];
        let mut held = VecDeque::new();
        assert_eq!(batch_of(&pairs, &mut held, 4), vec![1, 2, 3, 4]);
        assert_eq!(held, [(5, "c")], "the look-ahead is held, not lost");

        let split = [(1, "a"), (2, "a"), (3, "b"), (4, "c"), (5, "c")];
        let mut held = VecDeque::new();
        assert_eq!(batch_of(&split, &mut held, 4), vec![1, 2, 3]);
        assert_eq!(held, [(4, "c"), (5, "c")], "c's pair starts the next batch");
        assert_eq!(batch_of(&[], &mut held, 4), vec![4, 5]);
        assert!(held.is_empty());
    }

    #[test]
    fn a_batch_that_is_not_full_or_is_all_one_entity_is_taken_as_it_is() {
        let mut held = VecDeque::new();
        assert_eq!(batch_of(&[(1, "a"), (2, "a")], &mut held, 4), vec![1, 2]);
        assert!(held.is_empty());

        let one_entity = [(1, "a"), (2, "a"), (3, "a"), (4, "a")];
        assert_eq!(batch_of(&one_entity, &mut held, 3), vec![1, 2, 3]);
        assert_eq!(held, [(4, "a")]);
    }

    #[test]
    fn one_at_a_time_handlers_take_one_delivery_and_look_no_further() {
        let mut held = VecDeque::new();
        assert_eq!(batch_of(&[(1, "a")], &mut held, 1), vec![1]);
        assert!(held.is_empty());
    }

    #[test]
    fn a_one_at_a_time_handler_gets_a_slot_per_prefetched_delivery() {
        assert_eq!(batches_in_flight(64, 1), 64);
        assert_eq!(batches_in_flight(0, 1), 1);
    }

    #[test]
    fn a_batching_handler_gets_enough_slots_for_the_prefetch_in_full_batches() {
        assert_eq!(batches_in_flight(64, 16), 4);
        assert_eq!(batches_in_flight(65, 16), 5);
        assert_eq!(batches_in_flight(8, 16), 1);
    }

    #[test]
    fn a_batching_handler_has_the_next_round_of_batches_delivered_ahead() {
        assert_eq!(channel_prefetch(64, 16), 128);
        assert_eq!(channel_prefetch(64, 1), 64);
        assert_eq!(channel_prefetch(u16::MAX, 16), u16::MAX);
    }

    #[tokio::test]
    async fn a_stop_waiting_on_a_stuck_handler_says_so_until_it_finishes() {
        let tracker = tokio_util::task::TaskTracker::new();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        tracker.spawn(async move {
            let _ = released.await;
        });
        tracker.spawn(async {});
        tracker.close();
        let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiting = tokio::spawn({
            let (tracker, reports) = (tracker.clone(), reports.clone());
            async move {
                wait_reporting(
                    &tracker,
                    std::time::Duration::from_millis(20),
                    |still, waited| {
                        reports.lock().unwrap().push((still, waited));
                    },
                )
                .await;
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        assert!(!waiting.is_finished(), "returned while a handler still ran");
        release.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("still waiting after the last handler finished")
            .unwrap();

        let reports = reports.lock().unwrap().clone();
        assert!(!reports.is_empty(), "no report while a handler was stuck");
        assert!(reports.iter().all(|(still, _)| *still == 1), "{reports:?}");
        assert!(
            reports.windows(2).all(|pair| pair[0].1 < pair[1].1),
            "the time waited does not grow: {reports:?}"
        );
    }

    #[tokio::test]
    async fn a_stop_with_nothing_in_flight_returns_without_a_report() {
        let tracker = tokio_util::task::TaskTracker::new();
        tracker.close();
        let mut reports = 0;
        wait_reporting(&tracker, std::time::Duration::from_millis(1), |_, _| {
            reports += 1
        })
        .await;
        assert_eq!(reports, 0);
    }
}
