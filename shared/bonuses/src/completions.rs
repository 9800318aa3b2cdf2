//! Payment completions that arrive together, committed together (group commit): what the
//! gateway routes call instead of [`completion::complete`] directly.
//!
//! Why: a completion alone is six round trips and a commit, and under a burst of webhooks the
//! database's time goes to them rather than to the rows: in W3's benchmark the database's CPU per
//! grant is 1,510–1,732 µs with each completion alone and 620–842 µs committed together (about
//! 13 to a transaction), grants end to end 0.19 → 0.30–0.37 of the write ceiling.
//!
//! While [`BATCHES_IN_FLIGHT`] transactions run, new completions queue and the next free one
//! takes up to [`MAX_BATCH`] (a lone one goes straight through). The rule: nothing is decided
//! differently from a completion alone. A batch commits only when every charge made its
//! transition with a member of its own (a multi-table UPDATE changes a row once however often
//! the join meets it); anything else (a repeat, a refusal, a deadlock, a COMMIT of unknown
//! outcome) rolls it back and completes each request alone, with its own answer. A deadlock
//! victim is redone ([`DEADLOCK_TRIES`]); a stalled batch does not hold the queue.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use paybus_bus::Outbox;
use paybus_retry::Backoff;
use tokio::sync::oneshot;
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    BonusError,
    charge::{self, Payment},
    completion::{self, BonusRules, CompleteError, Completion, PaymentCompletion},
    event,
};

/// Completions in one transaction at most: keeps the statements' `IN` lists short and a
/// batch's member locks few.
pub const MAX_BATCH: usize = 16;

/// Transactions of completions running at once. More would leave nothing to batch (each
/// completion would start one of its own).
pub const BATCHES_IN_FLIGHT: usize = 4;

/// A batch running this long is waiting on something (a member row another transaction holds,
/// up to `innodb_lock_wait_timeout`): when every running batch is, the completions queued
/// behind them get a runner of their own instead of waiting for one to finish, so one slow
/// member never holds up everyone's payments (as none can when each completion has a
/// transaction of its own).
pub const STALLED_AFTER: Duration = Duration::from_millis(200);

/// What the batches have done since start-up (for tests and the benchmark).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// Transactions committed with more than one completion.
    pub batches: u64,
    /// Completions committed in them.
    pub completed_together: u64,
    /// Completions made on their own after their batch could not commit together.
    pub completed_apart: u64,
}

/// Completes payments, committing concurrent ones together; clones share the queue.
#[derive(Clone)]
pub struct Completions {
    outbox: Outbox,
    rules: BonusRules,
    queue: Arc<Mutex<Queue>>,
    counts: Arc<Counters>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Runner tasks alive: [`BATCHES_IN_FLIGHT`], and one more for each time every one of
    /// them was [stalled](STALLED_AFTER) with completions waiting.
    runners: usize,
    /// When each runner busy with a batch took it, by runner.
    busy_since: HashMap<u64, Instant>,
    next_runner: u64,
}

impl Queue {
    /// Counts a new runner in; its id.
    fn add_runner(&mut self) -> u64 {
        self.runners += 1;
        self.next_runner += 1;
        self.next_runner
    }

    /// Whether completions wait while every runner has been busy with one batch for
    /// [`STALLED_AFTER`] or more.
    fn stalled(&self, now: Instant) -> bool {
        !self.waiting.is_empty()
            && self.busy_since.len() == self.runners
            && self
                .busy_since
                .values()
                .all(|since| now.duration_since(*since) >= STALLED_AFTER)
    }
}

/// A completion waiting for its batch, with the span of the request that asked for it (so its
/// logs and its messages' trace context are the request's).
struct Waiting {
    request: PaymentCompletion,
    span: tracing::Span,
    answer: oneshot::Sender<Result<Completion, CompleteError>>,
}

impl Waiting {
    /// Completes it on its own ([`complete_alone`]) and answers; an answer nobody waits for
    /// any more (the request went away) is dropped.
    async fn answer_alone(self, outbox: &Outbox, rules: BonusRules) {
        let answer = complete_alone(outbox, rules, &self.request)
            .instrument(self.span)
            .await;
        let _ = self.answer.send(answer);
    }
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    completed_together: AtomicU64,
    completed_apart: AtomicU64,
}

impl Completions {
    pub fn new(outbox: Outbox, rules: BonusRules) -> Self {
        Self {
            outbox,
            rules,
            queue: Arc::default(),
            counts: Arc::default(),
        }
    }

    pub fn rules(&self) -> BonusRules {
        self.rules
    }

    pub fn counts(&self) -> BatchCounts {
        BatchCounts {
            batches: self.counts.batches.load(Ordering::Relaxed),
            completed_together: self.counts.completed_together.load(Ordering::Relaxed),
            completed_apart: self.counts.completed_apart.load(Ordering::Relaxed),
        }
    }

    /// Completes the payment (see [`completion`]), in a transaction of its own or with the
    /// completions that arrive meanwhile; the same answers either way.
    pub async fn complete(&self, request: PaymentCompletion) -> Result<Completion, CompleteError> {
        let (answer, mut answered) = oneshot::channel();
        let runner = {
            let mut queue = self.lock();
            queue.waiting.push_back(Waiting {
                request,
                span: tracing::Span::current(),
                answer,
            });
            (queue.runners < BATCHES_IN_FLIGHT).then(|| queue.add_runner())
        };
        if let Some(runner) = runner {
            tokio::spawn(self.clone().run(runner));
        }
        loop {
            match tokio::time::timeout(STALLED_AFTER, &mut answered).await {
                Ok(answer) => {
                    return answer.unwrap_or_else(|_| {
                        Err(BonusError::Inconsistent(
                            "the completion's batch ended without an answer (its task panicked, or the \
                             runtime is shutting down)"
                                .to_owned(),
                        )
                        .into())
                    });
                }
                Err(_) => self.run_beside_stalled_batches(),
            }
        }
    }

    /// Starts one more runner when every running batch is [stalled](STALLED_AFTER) with
    /// completions waiting behind them.
    fn run_beside_stalled_batches(&self) {
        let runner = {
            let mut queue = self.lock();
            queue.stalled(Instant::now()).then(|| queue.add_runner())
        };
        if let Some(runner) = runner {
            tracing::warn!(
                "every completion batch has been running for {STALLED_AFTER:?} or more; \
                 starting another beside them"
            );
            tokio::spawn(self.clone().run(runner));
        }
    }

    /// Takes batches off the queue until it is empty. The emptiness check and the runner count
    /// change under one lock, so a completion queued at any moment is either taken by a
    /// running runner or starts one.
    async fn run(self, id: u64) {
        let mut runner = Runner {
            queue: self.queue.clone(),
            id,
            done: false,
        };
        loop {
            let batch: Vec<Waiting> = {
                let mut queue = self.lock();
                queue.busy_since.remove(&id);
                if queue.waiting.is_empty() {
                    queue.runners -= 1;
                    runner.done = true;
                    return;
                }
                let take = queue.waiting.len().min(MAX_BATCH);
                queue.busy_since.insert(id, Instant::now());
                queue.waiting.drain(..take).collect()
            };
            self.complete_batch(batch).await;
        }
    }

    async fn complete_batch(&self, mut batch: Vec<Waiting>) {
        if batch.len() == 1 {
            let Some(one) = batch.pop() else { return };
            one.answer_alone(&self.outbox, self.rules).await;
            return;
        }
        let span = tracing::info_span!("completion batch", size = batch.len());
        match complete_together(&self.outbox, self.rules, &batch)
            .instrument(span)
            .await
        {
            Ok(completions) => {
                self.counts.batches.fetch_add(1, Ordering::Relaxed);
                self.counts
                    .completed_together
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for (waiting, completion) in batch.into_iter().zip(completions) {
                    let _ = waiting.answer.send(Ok(completion));
                }
            }
            Err(why) => {
                tracing::info!(size = batch.len(), %why,
                    "completions not committed together; completing each on its own");
                self.counts
                    .completed_apart
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                let mut apart = tokio::task::JoinSet::new();
                for waiting in batch {
                    let (outbox, rules) = (self.outbox.clone(), self.rules);
                    apart.spawn(async move { waiting.answer_alone(&outbox, rules).await });
                }
                while apart.join_next().await.is_some() {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Tries of a completion on its own that InnoDB keeps choosing as a deadlock's victim. Five
/// are not always enough under the full suite's load (4 of 120 concurrent completions of one
/// member can answer with the deadlock, rarely enough that 24 runs of that test beside busy
/// loops do not reproduce it); each try is a whole transaction rolled back, so more cost
/// nothing but time.
pub const DEADLOCK_TRIES: u32 = 10;

/// The pause before each try after a deadlock: 2, 4, 8, then 16 ms (110 ms in all).
const DEADLOCK_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(2), Duration::from_millis(16));

/// [`completion::complete`], tried again when InnoDB made it a deadlock's victim (rolled back
/// whole, so nothing of it stands). A batch holds several members' rows and the unique
/// index's entries of several gateway payments, so a completion alone beside it can close a
/// cycle that two completions alone never could (seen in this module's tests: one member's
/// concurrent completions beside batches that held that member).
async fn complete_alone(
    outbox: &Outbox,
    rules: BonusRules,
    request: &PaymentCompletion,
) -> Result<Completion, CompleteError> {
    let mut tries = 1;
    loop {
        match completion::complete(outbox, rules, request).await {
            Err(error) if error.is_deadlock() && tries < DEADLOCK_TRIES => {
                tracing::debug!(
                    charge_id = request.charge_id,
                    tries,
                    "completion deadlocked; trying again"
                );
                tokio::time::sleep(DEADLOCK_BACKOFF.delay(tries)).await;
                tries += 1;
            }
            answer => return answer,
        }
    }
}

/// A runner's place in [`Queue::runners`], given back if its task ends without emptying the
/// queue (a panic): later completions can then start runners again.
struct Runner {
    queue: Arc<Mutex<Queue>>,
    id: u64,
    done: bool,
}

impl Drop for Runner {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.runners -= 1;
            queue.busy_since.remove(&self.id);
        }
    }
}

/// Why a batch was rolled back rather than committed together.
#[derive(Debug, thiserror::Error)]
enum Apart {
    #[error("{matched} rows of charges and members matched, not {expected}")]
    NotEveryTransition { matched: u64, expected: usize },
    #[error("two of the charges belong to one member")]
    SharedMember,
    #[error("{read} of {expected} charges read back")]
    Missing { read: usize, expected: usize },
    #[error(transparent)]
    Failed(#[from] CompleteError),
}

impl From<sqlx::Error> for Apart {
    fn from(error: sqlx::Error) -> Self {
        Apart::Failed(error.into())
    }
}

impl From<BonusError> for Apart {
    fn from(error: BonusError) -> Self {
        Apart::Failed(error.into())
    }
}

/// The batch in one transaction, committed; the answers in the batch's order. On `Err` it was
/// rolled back and nothing of it was written.
async fn complete_together(
    outbox: &Outbox,
    rules: BonusRules,
    batch: &[Waiting],
) -> Result<Vec<Completion>, Apart> {
    let mut uow = outbox.begin_read_committed().await?;
    let written = async {
        let payments: Vec<Payment<'_>> = batch
            .iter()
            .map(|waiting| waiting.request.payment())
            .collect();
        let matched = charge::complete_and_credit_all(&mut uow, &payments).await?;
        if matched != 2 * batch.len() as u64 {
            return Err(Apart::NotEveryTransition {
                matched,
                expected: 2 * batch.len(),
            });
        }
        let ids: Vec<u64> = batch
            .iter()
            .map(|waiting| waiting.request.charge_id)
            .collect();
        let mut read = event::charges_and_standings(&mut uow, &ids).await?;
        if read.len() != batch.len() {
            return Err(Apart::Missing {
                read: read.len(),
                expected: batch.len(),
            });
        }
        let mut members = HashSet::new();
        if !read
            .iter()
            .all(|(charge, _)| members.insert(charge.member_id))
        {
            return Err(Apart::SharedMember);
        }
        let mut completions = Vec::with_capacity(batch.len());
        for waiting in batch {
            let Some(at) = read
                .iter()
                .position(|(charge, _)| charge.id == waiting.request.charge_id)
            else {
                return Err(Apart::Missing {
                    read: completions.len(),
                    expected: batch.len(),
                });
            };
            let (charge, standing) = read.swap_remove(at);
            let completed =
                completion::write_owed_bonuses(&mut uow, rules, charge, standing, Uuid::now_v7())
                    .instrument(waiting.span.clone())
                    .await?;
            completions.push(Completion::Completed(completed));
        }
        Ok(completions)
    }
    .await;
    match written {
        Ok(completions) => {
            uow.commit().await?;
            Ok(completions)
        }
        Err(why) => {
            if let Err(rollback) = uow.rollback().await {
                tracing::warn!(%rollback, "rolling back a completion batch failed");
            }
            Err(why)
        }
    }
}
