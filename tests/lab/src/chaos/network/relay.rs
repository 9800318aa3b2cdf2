//! TCP relays between the function processes and the services the harness runs on loopback
//! (MariaDB, RabbitMQ, the HTTP stubs), and the faults that live in them: latency without
//! netem, partitions without nft (a blackhole), socket resets without `ss -K`, and the reset
//! right after a COMMIT, which no packet filter can place.
//!
//! A connection is two pumps, client→server ("up") and server→client ("down"), each a queue
//! of chunks released in order at `max(previous release, arrival + delay)`. They obey their
//! slot's [`SlotFaults`] (a `watch`, so a change reaches every connection at once): while a
//! partition holds, nothing is read or written (the peers' TCP stacks see a silent path, and
//! recover when it ends); a socket kill resets the client with an RST and closes the server.

use std::{
    collections::VecDeque,
    fmt,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use serde::Serialize;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    time::Instant,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    mysql::{CommandStream, Seen},
    namespaces::Plan,
};
use crate::chaos::Dice;

/// One read's worth.
const READ_BUFFER: usize = 16 * 1024;
/// A pump stops reading while this much waits to be released (a delayed stream pushes back on
/// its sender, as a slow link would).
const MAX_QUEUED: usize = 1024 * 1024;
/// How long an injected COMMIT's answer is waited for before the client is reset anyway.
const COMMIT_ANSWER_WAIT: Duration = Duration::from_secs(10);

/// What a relay leads to: the peer a partition or a socket kill names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Peer {
    /// MariaDB / MySQL: its relay also finds COMMITs (for [`reset_after_commit`]).
    ///
    /// [`reset_after_commit`]: super::Network::reset_after_commit
    Database,
    /// A RabbitMQ node (a cluster: one relay per node, all of them this peer).
    Broker,
    /// An HTTP service the functions call (the quote service stub, the partners' endpoint).
    Http,
}

impl Peer {
    const COUNT: usize = 3;

    fn index(self) -> usize {
        match self {
            Self::Database => 0,
            Self::Broker => 1,
            Self::Http => 2,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Database => "database",
            Self::Broker => "broker",
            Self::Http => "http",
        })
    }
}

/// A delay of `base ± jitter` (uniform) on every chunk, each direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Latency {
    pub(crate) base: Duration,
    pub(crate) jitter: Duration,
}

impl Latency {
    fn sample(self, dice: &mut Dice) -> Duration {
        let jitter = self.jitter.as_micros() as usize;
        if jitter == 0 {
            return self.base;
        }
        let offset = Duration::from_micros(dice.below(2 * jitter + 1) as u64);
        (self.base + offset).saturating_sub(self.jitter)
    }
}

/// When a chunk that arrives `now` with `delay` goes out: never before the one ahead of it, so
/// a jittered stream stays in order (TCP would reorder nothing either).
fn release_time(previous: Instant, now: Instant, delay: Duration) -> Instant {
    (now + delay).max(previous)
}

/// The relay-level faults of one slot, which every connection of the slot obeys.
#[derive(Debug, Clone, Default)]
struct SlotFaults {
    /// The latency in force, with the id of the fault that set it.
    latency: Option<(u64, Latency)>,
    /// Partitions in force per peer (they may overlap).
    blackholes: [u32; Peer::COUNT],
    /// Socket kills so far per peer: a connection that saw fewer is reset.
    kills: [u64; Peer::COUNT],
}

struct SlotControl {
    faults: watch::Sender<SlotFaults>,
    commits_to_reset: AtomicU32,
    /// Connections open per peer.
    live: [AtomicUsize; Peer::COUNT],
}

impl SlotControl {
    fn new() -> Self {
        Self {
            faults: watch::Sender::new(SlotFaults::default()),
            commits_to_reset: AtomicU32::new(0),
            live: Default::default(),
        }
    }

    /// Takes one armed COMMIT reset, if any is left.
    fn take_commit_reset(&self) -> bool {
        self.commits_to_reset
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Counts a connection as live while it exists.
struct LiveGuard<'a>(&'a AtomicUsize);

impl<'a> LiveGuard<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the server answered to a COMMIT the relay kept from its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ServerReply {
    /// An OK packet: the transaction committed.
    Ok,
    /// An ERR packet with its error number: it did not.
    Error { code: u16 },
    /// Neither (the first payload byte).
    Other { first_byte: u8 },
    /// Nothing within the wait (the server may still commit).
    NoAnswer,
}

impl ServerReply {
    /// Reads a MySQL reply's first packet once its header and first payload bytes are in.
    fn read(bytes: &[u8]) -> Option<Self> {
        match bytes.get(4)? {
            0x00 => Some(Self::Ok),
            0xFF => Some(Self::Error {
                code: u16::from_le_bytes([*bytes.get(5)?, *bytes.get(6)?]),
            }),
            &first_byte => Some(Self::Other { first_byte }),
        }
    }
}

/// A COMMIT reset the relay injected: the client saw a reset, the server answered this.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CommitReset {
    pub(crate) at: chrono::DateTime<chrono::Utc>,
    pub(crate) slot: Option<usize>,
    pub(crate) namespace: Option<String>,
    pub(crate) relay: String,
    pub(crate) server: ServerReply,
}

impl CommitReset {
    /// Whether the server committed what the client was told nothing about.
    pub(crate) fn committed(&self) -> bool {
        self.server == ServerReply::Ok
    }
}

/// Where the relays listen and how a connection's slot is known.
#[derive(Debug, Clone)]
pub(crate) enum Binding {
    /// Namespaces: one listener per service on the run's relay address (on the host's `lo`,
    /// reachable from every namespace through its veth); a connection's slot is its client's
    /// address.
    Shared(Plan),
    /// No namespaces: every process connects from 127.0.0.1, so each slot has a listener of
    /// its own per service on 127.0.0.1 (plus one for anyone, as in the shared binding).
    PerSlot,
}

/// One service's relay.
#[derive(Debug, Clone)]
struct Relay {
    name: String,
    peer: Peer,
    upstream: SocketAddr,
    /// Its listener for anyone (and with namespaces, for every slot).
    shared: SocketAddr,
    /// Without namespaces: slot i's listener.
    per_slot: Vec<SocketAddr>,
}

/// Every relay of a run and the faults its slots are under.
pub(crate) struct Relays {
    binding: Binding,
    /// Slot i's control at i; the last one is for connections of no slot (never faulted).
    controls: Vec<Arc<SlotControl>>,
    namespaces: Vec<Option<String>>,
    relays: Mutex<Vec<Relay>>,
    resets: Arc<Mutex<Vec<CommitReset>>>,
    stop: CancellationToken,
    tasks: TaskTracker,
    connections: AtomicU64,
}

impl Relays {
    pub(crate) fn new(binding: Binding, slots: usize) -> Self {
        let namespaces = (0..slots)
            .map(|slot| match &binding {
                Binding::Shared(plan) => Some(plan.namespace(slot)),
                Binding::PerSlot => None,
            })
            .collect();
        Self {
            binding,
            controls: (0..=slots).map(|_| Arc::new(SlotControl::new())).collect(),
            namespaces,
            relays: Mutex::new(Vec::new()),
            resets: Arc::default(),
            stop: CancellationToken::new(),
            tasks: TaskTracker::new(),
            connections: AtomicU64::new(0),
        }
    }

    fn relays(&self) -> std::sync::MutexGuard<'_, Vec<Relay>> {
        self.relays.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts relaying to `upstream` (a service on the host's loopback); the address the
    /// processes of no particular slot use.
    pub(crate) async fn add(
        &self,
        name: &str,
        peer: Peer,
        upstream: SocketAddr,
    ) -> anyhow::Result<SocketAddr> {
        let ip = match &self.binding {
            Binding::Shared(plan) => IpAddr::V4(plan.relay_ip()),
            Binding::PerSlot => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let per_slot_count = match self.binding {
            Binding::Shared(_) => 0,
            Binding::PerSlot => self.controls.len() - 1,
        };
        let info = Arc::new(RelayInfo {
            name: name.to_owned(),
            peer,
            upstream,
        });
        let mut listeners = Vec::with_capacity(1 + per_slot_count);
        for listener_slot in std::iter::once(None).chain((0..per_slot_count).map(Some)) {
            let listener = TcpListener::bind((ip, 0))
                .await
                .with_context(|| format!("cannot bind the {name} relay on {ip}"))?;
            let address = listener.local_addr()?;
            listeners.push(address);
            self.tasks
                .spawn(self.accept(listener, listener_slot, info.clone()));
        }
        let shared = listeners[0];
        self.relays().push(Relay {
            name: name.to_owned(),
            peer,
            upstream,
            shared,
            per_slot: listeners[1..].to_vec(),
        });
        Ok(shared)
    }

    /// The accept loop of one listener.
    fn accept(
        &self,
        listener: TcpListener,
        listener_slot: Option<usize>,
        info: Arc<RelayInfo>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let stop = self.stop.clone();
        let tasks = self.tasks.clone();
        let controls = self.controls.clone();
        let namespaces = self.namespaces.clone();
        let resets = self.resets.clone();
        let plan = match &self.binding {
            Binding::Shared(plan) => Some(plan.clone()),
            Binding::PerSlot => None,
        };
        let seed = self.connections.fetch_add(1, Ordering::Relaxed);
        async move {
            let mut accepted = seed;
            loop {
                let (client, from) = tokio::select! {
                    () = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            tracing::warn!(relay = %info.name, error = %e, "relay accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                accepted = accepted.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let slot = listener_slot.or_else(|| match (from.ip(), &plan) {
                    (IpAddr::V4(ip), Some(plan)) => plan.slot_of(ip),
                    _ => None,
                });
                let control = controls[slot.unwrap_or(controls.len() - 1)].clone();
                let connection = Connection {
                    info: info.clone(),
                    slot,
                    namespace: slot.and_then(|s| namespaces[s].clone()),
                    control,
                    resets: resets.clone(),
                    stop: stop.child_token(),
                    seed: accepted,
                };
                tasks.spawn(connection.serve(client));
            }
        }
    }

    /// The address slot `slot` (or, `None`, anyone) reaches `upstream` at, if it is relayed.
    pub(crate) fn address(&self, slot: Option<usize>, upstream: SocketAddr) -> Option<SocketAddr> {
        let relays = self.relays();
        let relay = relays.iter().find(|r| r.upstream == upstream)?;
        Some(match slot {
            Some(slot) if !relay.per_slot.is_empty() => *relay.per_slot.get(slot)?,
            _ => relay.shared,
        })
    }

    /// `text` (a URL, a list of them, any setting) with every relayed service's
    /// `127.0.0.1:port` replaced by its relay's address for `slot`.
    pub(crate) fn rewrite(&self, slot: Option<usize>, text: &str) -> String {
        let upstreams: Vec<SocketAddr> = self.relays().iter().map(|r| r.upstream).collect();
        upstreams
            .into_iter()
            .fold(text.to_owned(), |text, upstream| {
                match self.address(slot, upstream) {
                    Some(relay) => {
                        replace_address(&text, &upstream.to_string(), &relay.to_string())
                    }
                    None => text,
                }
            })
    }

    /// The ports of every relay to `peer` on the shared binding (what a packet filter in a
    /// namespace matches).
    pub(crate) fn ports(&self, peer: Peer) -> Vec<u16> {
        self.relays()
            .iter()
            .filter(|r| r.peer == peer)
            .map(|r| r.shared.port())
            .collect()
    }

    pub(crate) fn has(&self, peer: Peer) -> bool {
        self.relays().iter().any(|r| r.peer == peer)
    }

    fn control(&self, slot: usize) -> &SlotControl {
        &self.controls[slot]
    }

    /// Delays slot `slot`'s connections (both directions) from now on; `id` names the fault.
    pub(crate) fn set_latency(&self, slot: usize, id: u64, latency: Latency) {
        self.control(slot)
            .faults
            .send_modify(|f| f.latency = Some((id, latency)));
    }

    /// Ends fault `id`'s latency, unless a later one replaced it.
    pub(crate) fn clear_latency(&self, slot: usize, id: u64) {
        self.control(slot).faults.send_if_modified(|f| {
            let current = f.latency.is_some_and(|(owner, _)| owner == id);
            if current {
                f.latency = None;
            }
            current
        });
    }

    /// Starts (`true`) or ends one partition of slot `slot` from `peer`.
    pub(crate) fn blackhole(&self, slot: usize, peer: Peer, on: bool) {
        self.control(slot).faults.send_modify(|f| {
            let count = &mut f.blackholes[peer.index()];
            *count = if on {
                *count + 1
            } else {
                count.saturating_sub(1)
            };
        });
    }

    /// Resets every open connection of slot `slot` to `peer`; how many there were.
    pub(crate) fn kill(&self, slot: usize, peer: Peer) -> usize {
        let control = self.control(slot);
        let live = control.live[peer.index()].load(Ordering::SeqCst);
        control.faults.send_modify(|f| f.kills[peer.index()] += 1);
        live
    }

    /// Arms `count` more COMMIT resets for slot `slot`'s database connections.
    pub(crate) fn arm_commit_resets(&self, slot: usize, count: u32) {
        self.control(slot)
            .commits_to_reset
            .fetch_add(count, Ordering::SeqCst);
    }

    /// Armed COMMIT resets not yet injected, for slot `slot`.
    pub(crate) fn commit_resets_armed(&self, slot: usize) -> u32 {
        self.control(slot).commits_to_reset.load(Ordering::SeqCst)
    }

    pub(crate) fn commit_resets(&self) -> Vec<CommitReset> {
        self.resets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Closes every listener and connection and waits (briefly) for their tasks.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(Duration::from_secs(10), self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("relay tasks still running 10 s after their stop");
        }
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Replaces `from` (an `ip:port`) in `text` wherever it is not part of a longer address.
fn replace_address(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, _) in text.match_indices(from) {
        let before = text[..at].chars().next_back();
        let after = text[at + from.len()..].chars().next();
        let whole = !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
            && !after.is_some_and(|c| c.is_ascii_digit());
        if whole {
            out.push_str(&text[copied..at]);
            out.push_str(to);
            copied = at + from.len();
        }
    }
    out.push_str(&text[copied..]);
    out
}

struct RelayInfo {
    name: String,
    peer: Peer,
    upstream: SocketAddr,
}

struct Connection {
    info: Arc<RelayInfo>,
    slot: Option<usize>,
    namespace: Option<String>,
    control: Arc<SlotControl>,
    resets: Arc<Mutex<Vec<CommitReset>>>,
    /// Cancelled when the relays stop, or when one pump ends the connection for both.
    stop: CancellationToken,
    seed: u64,
}

/// How a pump ended.
#[derive(Debug)]
enum End {
    /// Its source closed and everything was delivered; the destination was shut down.
    Eof,
    ReadFailed,
    WriteFailed,
    /// A socket kill.
    Killed,
    /// The other pump or the relays' stop ended it.
    Stopped,
    /// (Up) an injected COMMIT went to the server.
    CommitSent,
    /// (Down) the server's answer to an injected COMMIT, kept from the client.
    Answered(ServerReply),
}

/// What a pump does besides relaying.
enum Role {
    /// Client→server: finds COMMITs (a database relay) and says when an injected one is sent.
    Up {
        commits: Option<CommandStream>,
        swallow: watch::Sender<bool>,
    },
    /// Server→client: from the injected COMMIT on, keeps the server's answer from the client.
    Down { swallow: watch::Receiver<bool> },
}

struct Chunk {
    release: Instant,
    bytes: Vec<u8>,
    /// The last chunk of an injected COMMIT.
    commit: bool,
}

impl Connection {
    async fn serve(self, client: TcpStream) {
        let peer = self.info.peer;
        let mut faults = self.control.faults.subscribe();
        let epoch = faults.borrow().kills[peer.index()];
        // The upstream connection is made once no partition holds: a client that connects
        // during one gets no greeting (as with SYNs dropped) and times out on its own.
        loop {
            let state = faults.borrow_and_update().clone();
            if state.kills[peer.index()] != epoch {
                return reset(client);
            }
            if state.blackholes[peer.index()] == 0 {
                break;
            }
            tokio::select! {
                () = self.stop.cancelled() => return,
                changed = faults.changed() => if changed.is_err() { return },
            }
        }
        let server = match TcpStream::connect(self.info.upstream).await {
            Ok(server) => server,
            // Refused: the client sees a reset (the closest to a refused connect it can get,
            // having been accepted already).
            Err(_) => return reset(client),
        };
        // Small request/response exchanges (a MySQL statement, an AMQP frame) go out at once.
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let _live = LiveGuard::new(&self.control.live[peer.index()]);
        let (mut client, mut server) = (client, server);
        let (up, down) = {
            let (mut client_read, mut client_write) = client.split();
            let (mut server_read, mut server_write) = server.split();
            let (swallow_tx, swallow_rx) = watch::channel(false);
            let commits = (peer == Peer::Database).then(CommandStream::default);
            tokio::join!(
                self.pump(
                    &mut client_read,
                    &mut server_write,
                    Role::Up {
                        commits,
                        swallow: swallow_tx,
                    },
                    epoch,
                    self.seed,
                ),
                self.pump(
                    &mut server_read,
                    &mut client_write,
                    Role::Down {
                        swallow: swallow_rx
                    },
                    epoch,
                    self.seed.rotate_left(32),
                ),
            )
        };
        if let End::Answered(server_reply) = down {
            self.resets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(CommitReset {
                    at: chrono::Utc::now(),
                    slot: self.slot,
                    namespace: self.namespace.clone(),
                    relay: self.info.name.clone(),
                    server: server_reply,
                });
            tracing::info!(relay = %self.info.name, slot = ?self.slot, ?server_reply, "COMMIT reset injected");
        }
        // The client learns of a kill, a server's reset or an injected COMMIT by an RST; a
        // client's own failure just closes the server's side.
        let reset_client = matches!(up, End::Killed)
            || matches!(down, End::Killed | End::ReadFailed | End::Answered(_));
        drop(server);
        if reset_client {
            reset(client);
        }
    }

    /// One direction of the connection, until its source closes or the connection ends.
    async fn pump<R, W>(
        &self,
        src: &mut R,
        dst: &mut W,
        mut role: Role,
        epoch: u64,
        seed: u64,
    ) -> End
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let peer = self.info.peer.index();
        let stop = &self.stop;
        let mut faults = self.control.faults.subscribe();
        let mut dice = Dice::new(seed);
        let mut buf = vec![0_u8; READ_BUFFER];
        let mut queue: VecDeque<Chunk> = VecDeque::new();
        let mut queued = 0_usize;
        let mut last_release = Instant::now();
        let mut open = true;
        // Up: bytes read so far, and where an injected COMMIT ends.
        let mut offset = 0_u64;
        let mut cut: Option<u64> = None;
        // Down: whether the answer to an injected COMMIT is being kept, its bytes, and until
        // when it is waited for.
        let mut listening = matches!(role, Role::Down { .. });
        let mut swallowing = false;
        let mut answer = Vec::new();
        let mut deadline: Option<Instant> = None;
        loop {
            let state = faults.borrow_and_update().clone();
            if state.kills[peer] != epoch {
                stop.cancel();
                return End::Killed;
            }
            let held = state.blackholes[peer] > 0;
            if !open && queue.is_empty() {
                let _ = dst.shutdown().await;
                return End::Eof;
            }
            let release = queue.front().map(|chunk| chunk.release);
            // Biased: a fault's change is taken before data that is ready at the same moment,
            // so a chunk that arrives just after a latency was set is delayed by it.
            tokio::select! {
                biased;
                () = stop.cancelled() => return End::Stopped,
                changed = faults.changed() => {
                    if changed.is_err() {
                        return End::Stopped;
                    }
                }
                changed = swallow_changed(&mut role), if listening => {
                    listening = changed;
                    if changed && !swallowing {
                        swallowing = true;
                        deadline = Some(Instant::now() + COMMIT_ANSWER_WAIT);
                    }
                }
                () = sleep_until(deadline), if deadline.is_some() => {
                    stop.cancel();
                    return End::Answered(ServerReply::NoAnswer);
                }
                () = sleep_until(release), if release.is_some() && !held => {
                    if faults.borrow().blackholes[peer] > 0 {
                        continue;
                    }
                    let Some(chunk) = queue.pop_front() else { continue };
                    queued -= chunk.bytes.len();
                    if chunk.commit && let Role::Up { swallow, .. } = &role {
                        // Before the COMMIT leaves: whatever the server sends after it is
                        // its answer.
                        let _ = swallow.send(true);
                    }
                    let written = tokio::select! {
                        written = dst.write_all(&chunk.bytes) => written,
                        () = stop.cancelled() => return End::Stopped,
                    };
                    if written.is_err() {
                        stop.cancel();
                        return End::WriteFailed;
                    }
                    if chunk.commit {
                        return End::CommitSent;
                    }
                }
                read = src.read(&mut buf), if open && !held && queued < MAX_QUEUED => {
                    let n = match read {
                        Ok(0) => {
                            open = false;
                            continue;
                        }
                        Ok(n) => n,
                        Err(_) => {
                            stop.cancel();
                            return End::ReadFailed;
                        }
                    };
                    if swallowing {
                        answer.extend_from_slice(&buf[..n]);
                        if let Some(reply) = ServerReply::read(&answer) {
                            stop.cancel();
                            return End::Answered(reply);
                        }
                        continue;
                    }
                    let mut take = n;
                    let mut commit = false;
                    if let Role::Up { commits: Some(commits), .. } = &mut role {
                        for seen in commits.feed(&buf[..n]) {
                            match seen {
                                Seen::Commit { end } if cut.is_none() => {
                                    if self.control.take_commit_reset() {
                                        cut = Some(end);
                                    }
                                }
                                Seen::Tls => tracing::warn!(
                                    relay = %self.info.name,
                                    "a client switched to TLS: its COMMITs cannot be reset"
                                ),
                                Seen::Commit { .. } => {}
                            }
                        }
                        if let Some(end) = cut
                            && end <= offset + n as u64
                        {
                            // The COMMIT is the last thing the server gets; whatever the client
                            // sent after it is dropped with the connection.
                            take = (end - offset) as usize;
                            commit = true;
                            open = false;
                        }
                    }
                    offset += n as u64;
                    // The faults as they are now (the loop's copy may predate this read).
                    let latency = faults.borrow().latency;
                    let delay =
                        latency.map_or(Duration::ZERO, |(_, latency)| latency.sample(&mut dice));
                    let release = release_time(last_release, Instant::now(), delay);
                    last_release = release;
                    queue.push_back(Chunk {
                        release,
                        bytes: buf[..take].to_vec(),
                        commit,
                    });
                    queued += take;
                }
            }
        }
    }
}

/// (Down) waits until the injected-COMMIT flag changes; `false` once it never can again.
async fn swallow_changed(role: &mut Role) -> bool {
    match role {
        Role::Down { swallow } => swallow.changed().await.is_ok() && *swallow.borrow(),
        Role::Up { .. } => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Closes `stream` with an RST (SO_LINGER 0): its peer reads "connection reset", not an end of
/// stream, and cannot tell what happened to what it sent last.
fn reset(stream: TcpStream) {
    if let Err(e) = stream.set_zero_linger() {
        tracing::warn!(error = %e, "cannot set SO_LINGER 0: the client sees a close, not a reset");
    }
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jittered_stream_keeps_its_order() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        // Arrives at 0 with 250 ms, then at 10 ms with 150 ms: the second waits for the first.
        let first = release_time(start, start, ms(250));
        let second = release_time(first, start + ms(10), ms(150));
        assert_eq!(first, start + ms(250));
        assert_eq!(second, first);
        // Without latency a chunk goes at once, behind nothing.
        assert_eq!(
            release_time(start, start + ms(300), Duration::ZERO),
            start + ms(300)
        );
    }

    #[test]
    fn a_latency_sample_stays_within_its_jitter() {
        let latency = Latency {
            base: Duration::from_millis(200),
            jitter: Duration::from_millis(50),
        };
        let mut dice = Dice::new(7);
        let samples: Vec<Duration> = (0..2000).map(|_| latency.sample(&mut dice)).collect();
        assert!(samples.iter().all(|d| *d >= Duration::from_millis(150)));
        assert!(samples.iter().all(|d| *d <= Duration::from_millis(250)));
        assert!(samples.iter().any(|d| *d < Duration::from_millis(160)));
        assert!(samples.iter().any(|d| *d > Duration::from_millis(240)));
    }

    #[test]
    fn only_whole_addresses_are_rewritten() {
        let to = "10.213.3.1:40000";
        assert_eq!(
            replace_address("mysql://root@127.0.0.1:3306/paybus", "127.0.0.1:3306", to),
            "mysql://root@10.213.3.1:40000/paybus"
        );
        assert_eq!(
            replace_address(
                "amqp://g:g@127.0.0.1:3306/%2f,amqp://g:g@127.0.0.1:33061/%2f",
                "127.0.0.1:3306",
                to
            ),
            "amqp://g:g@10.213.3.1:40000/%2f,amqp://g:g@127.0.0.1:33061/%2f"
        );
        assert_eq!(
            replace_address("http://127.0.0.1:3306", "127.0.0.1:3306", to),
            "http://10.213.3.1:40000"
        );
        assert_eq!(
            replace_address("http://10.127.0.1:3306", "127.0.0.1:3306", to),
            "http://10.127.0.1:3306"
        );
    }

    #[test]
    fn a_server_reply_is_read_from_its_first_packet() {
        assert_eq!(ServerReply::read(&[7, 0, 0, 1]), None);
        assert_eq!(
            ServerReply::read(&[7, 0, 0, 1, 0x00]),
            Some(ServerReply::Ok)
        );
        assert_eq!(
            ServerReply::read(&[9, 0, 0, 1, 0xFF, 0x15, 0x04]),
            Some(ServerReply::Error { code: 1045 })
        );
    }
}
