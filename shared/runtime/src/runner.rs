//! Runs functions as local consumers, with their dead-letter recorders and the sweeper, in
//! one process: a single function binary uses it for one handler, `paybus run` for all.

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use paybus_bus::{
    consumer::consume,
    dead_letter::{DeadLetterRecorder, UnroutedRecorder},
    delivery::Processor,
    handler::{Handler, HandlerProcessor},
    outbox::{Relay, RelayConfig},
    pauses::{PauseReader, PauseWatch},
    services::{Services, StartupError},
    topology::FunctionQueue,
};
use paybus_maintenance as maintenance;
use paybus_maintenance::{ActivityFlush, Job, OutboxRelayJob};

/// The relay every process runs: each local process relays its own leftovers (several relays
/// are safe), and the scheduled sweeper Lambda runs it in AWS.
pub fn outbox_relay_job(services: &Services) -> Arc<dyn Job> {
    let relay = Relay::new(services.outbox.clone(), RelayConfig::default());
    Arc::new(OutboxRelayJob::new(relay, Duration::from_secs(1)))
}

type Task = Pin<Box<dyn Future<Output = Result<(), lapin::Error>> + Send>>;
type Starter = Box<dyn FnOnce(CancellationToken) -> Task + Send>;

/// How often a stopping runner names what it still waits for.
const STOP_REPORT_EVERY: Duration = Duration::from_secs(10);

pub struct Runner {
    services: Services,
    queues: Vec<FunctionQueue>,
    /// Each consumer's start, named by its queue (what a slow stop names).
    starters: Vec<(String, Starter)>,
    jobs: Vec<Arc<dyn Job>>,
    pauses: PauseReader,
}

impl Runner {
    /// A runner with the outbox relay job and the recorder of unroutable messages already
    /// registered.
    pub fn new(services: Services) -> Self {
        let mut runner = Self {
            jobs: vec![
                outbox_relay_job(&services),
                Arc::new(ActivityFlush::new(services.pool.clone())),
            ],
            queues: Vec::new(),
            starters: Vec::new(),
            pauses: PauseReader::new(services.pool.clone()),
            services,
        };
        let unrouted = Arc::new(UnroutedRecorder::new(runner.services.pool.clone()));
        runner.add_consumer(unrouted, PauseWatch::never());
        runner
    }

    pub fn services(&self) -> &Services {
        &self.services
    }

    /// The queues of the functions added so far (what [`Runner::run`] declares and consumes).
    pub fn queues(&self) -> &[FunctionQueue] {
        &self.queues
    }

    /// The names of the jobs added so far, the outbox relay first.
    pub fn job_names(&self) -> Vec<&'static str> {
        self.jobs.iter().map(|job| job.name()).collect()
    }

    /// Adds a function's consumer and the recorder of its dead-letter queue.
    /// Adds a function's consumers (one per shard of the settings' layout, sharing the
    /// handler) and the recorder of its dead-letter queue.
    pub fn add_function<H: Handler>(&mut self, handler: H) -> &mut Self {
        let handler = Arc::new(handler);
        let shards = H::queue().queues_in(&self.services.settings.broker.shards);
        for queue in &shards {
            let processor = Arc::new(HandlerProcessor::on(
                handler.clone(),
                self.services.outbox.clone(),
                queue,
            ));
            let pauses = self.pauses.watch();
            self.add_consumer(processor, pauses);
        }
        for queue in shards {
            self.add_dead_letter_recorder(queue);
        }
        self
    }

    /// Adds the recorder of one function's dead-letter queue (alone: the `dead-letters`
    /// binary records every function's), once however many of its queues are added.
    pub fn add_dead_letter_recorder(&mut self, queue: FunctionQueue) -> &mut Self {
        let recorded = self.queues.iter().any(|q| q.function == queue.function);
        if !self.queues.contains(&queue) {
            self.queues.push(queue);
        }
        if recorded {
            return self;
        }
        let recorder = Arc::new(DeadLetterRecorder::new(
            queue.function,
            self.services.pool.clone(),
        ));
        self.add_consumer(recorder, PauseWatch::never());
        self
    }

    fn add_consumer<P: Processor>(&mut self, processor: Arc<P>, pauses: PauseWatch) {
        let services = self.services.clone();
        let name = format!("consumer of {}", processor.queue());
        self.starters.push((
            name,
            Box::new(move |shutdown| {
                Box::pin(async move {
                    consume(
                        &services.link,
                        processor,
                        services.publisher().clone(),
                        services.settings.broker.prefetch,
                        pauses,
                        shutdown,
                    )
                    .await
                })
            }),
        ));
    }

    pub fn add_job(&mut self, job: Arc<dyn Job>) -> &mut Self {
        self.jobs.push(job);
        self
    }

    /// Declares the topology, starts everything and runs until `shutdown` is cancelled; then
    /// every consumer finishes its in-flight messages before this returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), StartupError> {
        // Bounded (bus/link.rs), but by minutes: a stop must not wait for a broker that took
        // the connection and went silent.
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            declared = self.services.declare_topology(&self.queues) => declared?,
        }
        // A function paused before this process started must not take one delivery: the
        // consumers start after the pauses were read once.
        while let Err(error) = self.pauses.read().await {
            tracing::warn!(%error, "reading function_pauses before consuming; trying again");
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(paybus_bus::pauses::POLL_INTERVAL) => {}
            }
        }
        let mut tasks = tokio::task::JoinSet::new();
        // The running tasks by name: a stop that takes long says which ones it waits for.
        let mut running: HashMap<tokio::task::Id, String> = HashMap::new();
        let pauses = self.pauses;
        let pauses_shutdown = shutdown.clone();
        let pauses_task = tasks.spawn(async move {
            pauses.run(pauses_shutdown).await;
            Ok(())
        });
        running.insert(pauses_task.id(), "the pauses' reader".to_owned());
        for (name, start) in self.starters {
            running.insert(tasks.spawn(start(shutdown.clone())).id(), name);
        }
        let jobs = self.jobs;
        let sweeper_shutdown = shutdown.clone();
        let sweeper_task = tasks.spawn(async move {
            maintenance::run(jobs, sweeper_shutdown).await;
            Ok(())
        });
        running.insert(sweeper_task.id(), "the sweeper's jobs".to_owned());
        let mut first_error = None;
        let mut stop_reports = tokio::time::interval(STOP_REPORT_EVERY);
        stop_reports.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping_since: Option<tokio::time::Instant> = None;
        loop {
            let joined = tokio::select! {
                biased;
                joined = tasks.join_next_with_id() => match joined {
                    Some(joined) => joined,
                    None => break,
                },
                () = shutdown.cancelled(), if stopping_since.is_none() => {
                    stopping_since = Some(tokio::time::Instant::now());
                    stop_reports.reset();
                    continue;
                }
                _ = stop_reports.tick(), if stopping_since.is_some() => {
                    let mut still: Vec<&str> = running.values().map(String::as_str).collect();
                    still.sort_unstable();
                    tracing::warn!(
                        waited_seconds = stopping_since.map_or(0, |since| since.elapsed().as_secs()),
                        still_running = %still.join(", "),
                        "stopping: waiting for these to end"
                    );
                    continue;
                }
            };
            let id = match &joined {
                Ok((id, _)) => *id,
                Err(join_error) => join_error.id(),
            };
            let name = running.remove(&id).unwrap_or_default();
            match joined.map(|(_, result)| result) {
                Ok(Ok(())) => {}
                Ok(Err(source)) => {
                    // One consumer that cannot start (e.g. a queue declared with other
                    // arguments) stops the whole process: half a system is worse than none.
                    shutdown.cancel();
                    first_error.get_or_insert(StartupError::Amqp {
                        doing: "consuming",
                        source,
                    });
                }
                Err(join_error) => {
                    shutdown.cancel();
                    tracing::error!(%join_error, task = %name, "a runner's task panicked");
                }
            }
        }
        // What the last messages counted before the stop (the flush job's timer is gone).
        if let Err(error) = paybus_bus::activity::flush(&self.services.pool).await {
            tracing::warn!(%error, "could not record the last activity counts");
        }
        first_error.map_or(Ok(()), Err)
    }
}
