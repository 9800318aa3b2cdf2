//! The local transport: a lapin consumer per function queue.
//!
//! Semantics (also in the README): a delivery is acked only after its handler's transaction
//! committed, or after its dead letter was confirmed by the broker (the acks go out in runs:
//! `bus/acks.rs`); prefetch bounds how many are in flight; an infrastructure error requeues it
//! after a back-off pause. SIGTERM (the shutdown token) stops taking deliveries, lets in-flight
//! ones finish, then returns. A paused function (`bus/pauses.rs`) stops taking deliveries the
//! same way and subscribes again on resume.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures_util::{FutureExt, StreamExt, future::join_all};
use lapin::{
    Acker, Connection,
    message::Delivery,
    options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions},
    types::FieldTable,
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
};

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
            // The first subscription failing is a configuration error (no such queue, other
            // arguments): fail loudly. Later ones follow an outage: wait for the link.
            Err(error) if first => return Err(error),
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
    in_flight.wait().await;
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
    let channel = connection.create_channel().await?;
    let window = channel_prefetch(prefetch, max_batch);
    channel
        .basic_qos(window, BasicQosOptions::default())
        .await?;
    let tag = format!("{}-{}", processor.function(), uuid::Uuid::new_v4().simple());
    let mut deliveries = channel
        .basic_consume(
            processor.queue().as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let batches = Arc::new(Semaphore::new(batches_in_flight(prefetch, max_batch)));
    let acks = ChannelAcks::new(window);
    tracing::info!(function = processor.function(), queue = %processor.queue(), prefetch, max_batch, "consuming");
    let ended = loop {
        let slot = tokio::select! {
            ended = ending.next() => break ended,
            slot = batches.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_closed) => break Ended::Shutdown,
            },
        };
        tokio::select! {
            ended = ending.next() => break ended,
            next = deliveries.next() => match next {
                Some(Ok(delivery)) => {
                    let batch = take_buffered(&mut deliveries, delivery, max_batch);
                    let processor = processor.clone();
                    let publisher = publisher.clone();
                    let acks = acks.clone();
                    in_flight.spawn(async move {
                        settle(&*processor, &publisher, &acks, batch).await;
                        drop(slot);
                    });
                }
                Some(Err(error)) => {
                    // A connection drop surfaces here; lapin usually recovers the channel and
                    // the consumer on this stream, else the link replaces the connection.
                    tracing::warn!(function = processor.function(), %error, "consumer interrupted; waiting for recovery");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                // The consumer is gone for good (cancelled by the broker, channel closed).
                None => break ending.next().await,
            }
        }
    };
    if matches!(ended, Ended::Shutdown | Ended::Paused) {
        let _ = channel
            .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
            .await;
        // Let in-flight deliveries settle on this channel before it closes; prefetched
        // ones never started go back to the queue with the channel.
        in_flight.close();
        in_flight.wait().await;
        let _ = channel.close(200, "stopped consuming".into()).await;
    }
    Ok(ended)
}

/// How many batches a consumer processes at once. A handler that takes one message at a time
/// gets one slot per prefetched delivery, as before batches existed. A batching handler gets
/// `prefetch / max_batch` slots: when they are all busy the broker's deliveries wait in the
/// buffer, so the next batch is a full one. Without the bound every delivery started its own
/// transaction the moment it arrived, batches stayed at one or two messages, and 64 small
/// transactions fought over two cores (the W2 benchmark's broker phase ran at 0.6x direct, docs/benchmarks.md).
fn batches_in_flight(prefetch: u16, max_batch: usize) -> usize {
    usize::from(prefetch.max(1)).div_ceil(max_batch).max(1)
}

/// What the broker may hand a consumer ahead of its acks. A batching handler is allowed twice
/// its `prefetch`: a round of full batches in flight and the next round already delivered.
/// With exactly `prefetch`, a finished batch's acks were what let the broker send more, so
/// the slot it freed started on the first one or two messages to arrive (the W2 benchmark's
/// broker phase formed batches of about 11 of 16 and ran at 0.6x direct).
fn channel_prefetch(prefetch: u16, max_batch: usize) -> u16 {
    if max_batch > 1 {
        prefetch.saturating_mul(2)
    } else {
        prefetch
    }
}

/// `first`, and the deliveries the broker has already handed over behind it, up to `max`: a
/// batch never waits for more to arrive. A stream error or end met here is left for the main
/// loop's next poll, which sees it again.
fn take_buffered(deliveries: &mut lapin::Consumer, first: Delivery, max: usize) -> Vec<Delivery> {
    let mut batch = vec![first];
    while batch.len() < max {
        match deliveries.next().now_or_never() {
            Some(Some(Ok(delivery))) => batch.push(delivery),
            Some(Some(Err(error))) => {
                tracing::warn!(%error, "consumer interrupted while taking a batch");
                break;
            }
            Some(None) | None => break,
        }
    }
    batch
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
    use super::{batches_in_flight, channel_prefetch};

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
}
