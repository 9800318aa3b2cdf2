//! The broker connection, kept alive: a watchdog checks it every second, opens a fresh one when
//! it is down (backing off, trying a cluster's nodes in turn from the one after the node that
//! dropped), declares the topology it knows again, and bumps a generation number that consumers
//! follow; the publisher always takes the live channel.
//!
//! It also follows the broker's `connection.blocked` / `connection.unblocked` notices (a memory
//! or disk alarm): while blocked, [`BrokerLink::blocked`] makes publishes fail at once instead
//! of buffering in lapin. RabbitMQ tells a connection only once it publishes during the alarm.
//!
//! Why not lapin's auto-recovery: in broker-restart tests (RabbitMQ 3.10, lapin 4.12.3) it
//! sometimes gave up, leaving the process connected to nothing, and sometimes completed after a
//! replacement, leaving a consumer with prefetched deliveries nobody read. docs/bus.md ("Broker
//! outages and clusters") has the behaviour and the tests that check it.

use std::{
    sync::{
        Arc, Mutex, RwLock, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::{StreamExt, stream::BoxStream};
use lapin::{Channel, Connection, Event, options::ConfirmSelectOptions};
use tokio::sync::watch;

use super::{
    metrics,
    topology::{self, FunctionQueue},
};
use crate::broker::{self, BrokerUnreachable, REPLY_TIMEOUT, connection_lost, within};
use paybus_config::BrokerSettings;
use paybus_retry::Backoff;

const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The pause between reconnection attempts while the broker is away (2 s doubling, at most
/// 10 s).
pub(crate) const RECONNECT_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_secs(2), Duration::from_secs(10));

/// One live connection and its confirm-mode publishing channel.
pub struct Live {
    pub connection: Arc<Connection>,
    pub publish_channel: Channel,
}

#[derive(Clone)]
pub struct BrokerLink {
    inner: Arc<Inner>,
}

struct Inner {
    settings: BrokerSettings,
    live: RwLock<Arc<Live>>,
    /// The index (in `settings.urls()`) of the node the live connection is to.
    node: AtomicUsize,
    generation: watch::Sender<u64>,
    topology: RwLock<Vec<FunctionQueue>>,
    blocking: Mutex<Blocking>,
}

/// What the broker last said about the live connection's publishing.
struct Blocking {
    /// The generation of the connection this is about: a notice that a replaced connection's
    /// listener still receives changes nothing.
    generation: u64,
    /// The broker's reason (`low on memory`, `low on disk`, `low on disk & memory`) and since
    /// when, while it blocks the connection.
    blocked: Option<(String, Instant)>,
}

/// A connection's `connection.blocked` / `connection.unblocked` notices (lapin's events).
type Notices = BoxStream<'static, Event>;

/// A connection to the first node that takes it, from node `first` on, with its publishing
/// channel; that node's index; and the connection's notices, listened to before it publishes
/// anything (which is when the broker first tells it of an alarm).
async fn open(
    settings: &BrokerSettings,
    first: usize,
) -> Result<(Live, usize, Notices), BrokerUnreachable> {
    let (connection, node) = broker::connect_from(settings, first).await?;
    let notices = connection.events_listener().boxed();
    let publish_channel =
        open_publish_channel(&connection)
            .await
            .map_err(|source| BrokerUnreachable {
                url: paybus_config::redact::url(settings.node(node)),
                source,
            })?;
    let live = Live {
        connection: Arc::new(connection),
        publish_channel,
    };
    Ok((live, node, notices))
}

async fn open_publish_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    within(REPLY_TIMEOUT, "publishing channel", async {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    })
    .await
}

impl BrokerLink {
    /// Connects and starts the watchdog (it stops when the last clone of the link is gone).
    pub async fn connect(settings: &BrokerSettings) -> Result<Self, BrokerUnreachable> {
        let (live, node, notices) = open(settings, 0).await?;
        let link = Self {
            inner: Arc::new(Inner {
                settings: settings.clone(),
                live: RwLock::new(Arc::new(live)),
                node: AtomicUsize::new(node),
                generation: watch::channel(0).0,
                topology: RwLock::new(Vec::new()),
                blocking: Mutex::new(Blocking {
                    generation: 0,
                    blocked: None,
                }),
            }),
        };
        tokio::spawn(listen_for_blocking(&link.inner, 0, notices));
        tokio::spawn(watchdog(Arc::downgrade(&link.inner)));
        Ok(link)
    }

    /// The broker's reason while it blocks the live connection (a resource alarm, as RabbitMQ
    /// words it: `low on memory`, `low on disk`); `None` otherwise.
    pub fn blocked(&self) -> Option<String> {
        self.inner
            .blocking()
            .blocked
            .as_ref()
            .map(|(reason, _)| reason.clone())
    }

    pub fn current(&self) -> Arc<Live> {
        self.inner
            .live
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The node the live connection is to: its index in [`BrokerSettings::urls`] (0 for a
    /// single broker).
    pub fn node(&self) -> usize {
        self.inner.node.load(Ordering::SeqCst)
    }

    /// Messages ready in queue `name` and its consumers, `None` when it does not exist (probed
    /// on a channel of its own: a passive declare of a missing queue closes its channel).
    /// Bounded: on a connection the broker blocks, lapin sends nothing, so the channel would
    /// never open.
    pub async fn queue_depth(&self, name: &str) -> Result<Option<QueueDepth>, lapin::Error> {
        use lapin::{options::QueueDeclareOptions, types::FieldTable};
        let connection = self.current().connection.clone();
        within(REPLY_TIMEOUT, "queue inspected", async {
            let channel = connection.create_channel().await?;
            let declared = channel
                .queue_declare(
                    name.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await;
            Ok(match declared {
                Ok(queue) => {
                    let _ = channel.close(200, "queue inspected".into()).await;
                    Some(QueueDepth {
                        ready: queue.message_count(),
                        consumers: queue.consumer_count(),
                    })
                }
                Err(_) => None,
            })
        })
        .await
    }

    /// Changes whenever the link has replaced the connection.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.inner.generation.subscribe()
    }

    /// Replaces the publishing channel `nacked` with a fresh one on the same connection, unless
    /// it was replaced already. Why: RabbitMQ 3.10's quorum-queue client inside a channel that
    /// first published during a leader election can keep the dead leader and nack every
    /// publish on that channel for as long as it lives (in the cluster failover test, minutes
    /// of nacks while a fresh channel on the same node publishes fine). Publishes still in
    /// flight on the old channel fail; their outbox rows are published again by the relay.
    pub async fn renew_publish_channel(&self, nacked: &Channel) {
        let live = self.current();
        if live.publish_channel.id() != nacked.id() {
            return;
        }
        let channel = match open_publish_channel(&live.connection).await {
            Ok(channel) => channel,
            Err(error) => {
                tracing::warn!(%error, "cannot open a fresh publishing channel; keeping the old one");
                return;
            }
        };
        let replaced = {
            let mut slot = self
                .inner
                .live
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let unchanged = Arc::ptr_eq(&slot.connection, &live.connection)
                && slot.publish_channel.id() == nacked.id();
            if unchanged {
                *slot = Arc::new(Live {
                    connection: live.connection.clone(),
                    publish_channel: channel.clone(),
                });
            }
            unchanged
        };
        let retired = if replaced { nacked } else { &channel };
        let _ = retired
            .close(200, "publishing channel replaced".into())
            .await;
        if replaced {
            tracing::warn!(
                node = self.node(),
                "the broker nacked a publish; publishing on a fresh channel from now on"
            );
        }
    }

    /// Declares the topology now, and again on every replacement connection.
    pub async fn declare(&self, functions: &[FunctionQueue]) -> Result<(), lapin::Error> {
        {
            let mut known = self
                .inner
                .topology
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for f in functions {
                if !known.contains(f) {
                    known.push(*f);
                }
            }
        }
        // A connection lost meanwhile is replaced by the watchdog, which declares everything
        // known (these queues included) on the next one: the declare waits for it and goes
        // again, a few times, rather than stop a process starting while a node goes away.
        let mut generation = self.generation();
        let mut losses = 0;
        loop {
            generation.borrow_and_update();
            match declare_on(&self.current().connection, functions).await {
                Err(error) if connection_lost(&error) && losses < DECLARE_LOSSES => {
                    losses += 1;
                    tracing::warn!(%error, losses, "declaring the topology: the connection went; waiting for the broker link");
                    // Bounded: a timeout on a connection that still lives brings no new one.
                    let _ = tokio::time::timeout(REPLY_TIMEOUT, generation.changed()).await;
                }
                done => return done,
            }
        }
    }
}

/// How many lost connections a declare outlives before it gives up with the last error.
const DECLARE_LOSSES: u32 = 5;

/// What a queue holds now ([`BrokerLink::queue_depth`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QueueDepth {
    pub ready: u32,
    pub consumers: u32,
}

/// How long declaring the whole topology may take: a request at a time, a quorum queue's
/// declare waiting for its replicas. Unbounded, a node that went silent mid-declare would
/// hold the watchdog (and with it every reconnection) or a process's start for good.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(120);

async fn declare_on(
    connection: &Connection,
    functions: &[FunctionQueue],
) -> Result<(), lapin::Error> {
    within(
        TOPOLOGY_TIMEOUT,
        "topology declared",
        declare_all_on(connection, functions),
    )
    .await
}

async fn declare_all_on(
    connection: &Connection,
    functions: &[FunctionQueue],
) -> Result<(), lapin::Error> {
    let channel = connection.create_channel().await?;
    let channel = match topology::declare(&channel, functions).await {
        Ok(()) => channel,
        // A broker set up before `paybus.events` had its alternate exchange: an exchange's
        // arguments cannot change, so it is replaced once (its bindings are declared again
        // right after; a publish in between is returned as unroutable and retried by the
        // outbox).
        Err(error) if topology::is_events_exchange_without_alternate(&error) => {
            tracing::warn!(
                exchange = topology::EVENTS_EXCHANGE,
                "upgrading the events exchange with its alternate exchange (paybus.unrouted)"
            );
            let channel = connection.create_channel().await?;
            channel
                .exchange_delete(
                    topology::EVENTS_EXCHANGE.into(),
                    lapin::options::ExchangeDeleteOptions::default(),
                )
                .await?;
            topology::declare(&channel, functions).await?;
            channel
        }
        Err(error) => return Err(error),
    };
    let _ = channel.close(200, "topology declared".into()).await;
    Ok(())
}

async fn watchdog(inner: Weak<Inner>) {
    let mut failures: u32 = 0;
    // A node that took the connection but could not declare the topology: the next try starts
    // after it.
    let mut unusable: Option<usize> = None;
    loop {
        let pause = if failures == 0 {
            CHECK_EVERY
        } else {
            RECONNECT_BACKOFF.delay(failures)
        };
        tokio::time::sleep(pause).await;
        let Some(inner) = inner.upgrade() else { return };
        let live = inner
            .live
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if live.connection.status().connected() {
            failures = 0;
            continue;
        }
        // The node that dropped is tried last: the next one is likelier to be alive.
        let lost = inner.node.load(Ordering::SeqCst);
        let (fresh, node, notices) = match open(&inner.settings, unusable.unwrap_or(lost) + 1).await
        {
            Ok(fresh) => fresh,
            Err(error) => {
                // Once, then every ~30 s: an outage should be visible, not flood the log.
                if failures.is_multiple_of(5) {
                    tracing::warn!(%error, failures, "broker unreachable; reconnecting");
                }
                failures = failures.saturating_add(1);
                continue;
            }
        };
        let url = paybus_config::redact::url(inner.settings.node(node));
        let topology = inner
            .topology
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Err(error) = declare_on(&fresh.connection, &topology).await {
            tracing::warn!(%url, %error, "new broker connection could not declare the topology; retrying");
            unusable = Some(node);
            failures = failures.saturating_add(1);
            continue;
        }
        let generation = *inner.generation.borrow() + 1;
        inner.start_blocking_anew(generation);
        *inner
            .live
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(fresh);
        inner.node.store(node, Ordering::SeqCst);
        inner.generation.send_replace(generation);
        tokio::spawn(listen_for_blocking(&inner, generation, notices));
        tracing::warn!(
            %url,
            node,
            lost_node = lost,
            after_failures = failures,
            "broker connection re-established"
        );
        failures = 0;
        unusable = None;
    }
}

impl Inner {
    fn blocking(&self) -> std::sync::MutexGuard<'_, Blocking> {
        self.blocking
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records what the broker said about connection `generation`: that it blocks it, and why,
    /// or (`None`) that it no longer does.
    fn note_blocking(&self, generation: u64, reason: Option<String>) {
        let mut blocking = self.blocking();
        if blocking.generation != generation {
            return;
        }
        let node = self.node.load(Ordering::SeqCst);
        blocking.blocked = match (blocking.blocked.take(), reason) {
            (None, Some(reason)) => {
                tracing::warn!(
                    node,
                    %reason,
                    "the broker blocks this process's connection (a resource alarm): nothing is \
                     published or acknowledged on it until the alarm clears"
                );
                metrics::broker_link_blocked(true);
                Some((reason, Instant::now()))
            }
            (Some((_, since)), None) => {
                tracing::info!(
                    node,
                    blocked_for = ?since.elapsed(),
                    "the broker unblocked this process's connection: its resource alarm cleared"
                );
                metrics::broker_link_blocked(false);
                None
            }
            // Another alarm joined the first (`low on disk & memory`).
            (Some((_, since)), Some(reason)) => Some((reason, since)),
            (None, None) => None,
        };
    }

    /// Connection `generation` replaces the live one. The broker has told it nothing yet: if
    /// the alarm still holds, it blocks the new connection at its first publish and says so.
    fn start_blocking_anew(&self, generation: u64) {
        let mut blocking = self.blocking();
        if let Some((reason, since)) = blocking.blocked.take() {
            tracing::info!(
                %reason,
                blocked_for = ?since.elapsed(),
                "the connection the broker blocked was replaced; the broker blocks the new one \
                 too if it publishes while the alarm holds"
            );
            metrics::broker_link_blocked(false);
        }
        blocking.generation = generation;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let blocking = self
            .blocking
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if blocking.blocked.is_some() {
            metrics::broker_link_blocked(false);
        }
    }
}

/// Follows connection `generation`'s notices until the link replaces that connection or is
/// gone.
fn listen_for_blocking(
    inner: &Arc<Inner>,
    generation: u64,
    mut notices: Notices,
) -> impl Future<Output = ()> + use<> {
    let mut replaced = inner.generation.subscribe();
    let inner = Arc::downgrade(inner);
    async move {
        loop {
            let notice = tokio::select! {
                notice = notices.next() => notice,
                _ = replaced.changed() => return,
            };
            let Some(inner) = inner.upgrade() else { return };
            match notice {
                Some(Event::ConnectionBlocked(reason)) => {
                    inner.note_blocking(generation, Some(reason));
                }
                Some(Event::ConnectionUnblocked) => inner.note_blocking(generation, None),
                Some(_) => {}
                None => return,
            }
        }
    }
}
