//! Per-function outcome counters and handler latency, kept in the process. The log line of
//! each outcome carries the same facts for log-based metrics (CloudWatch in Lambda).
//!
//! The same figures in the Prometheus format ([`encode`], served at the API's `/metrics`):
//! `paybus_messages_total{function,outcome}` (outcome `done` = processed, `skipped`, `retry`
//! and `requeued` = retried, `failed` / `dead_lettered` / `malformed` = dead-lettered,
//! `refused` = in a Lambda event from a queue that is not the function's, left unprocessed,
//! and a function's own labels such as `deferred`), `paybus_handler_seconds{function}` (a
//! histogram of handler latency), `paybus_audit_violations_total{check}` and the last audit
//! pass, `paybus_external_calls_total{call,outcome}` (every call with a side effect elsewhere,
//! by what it is known to have done: `done`, `not_done`, `unknown`), `paybus_broker_blocked`
//! (1 while the broker blocks this process's connection: a resource alarm),
//! `paybus_build_info{version,commit}` (the build this process runs); plus gauges the caller
//! reads from the database at scrape time ([`Gauges`]).

use std::{
    collections::BTreeMap,
    sync::{Mutex, OnceLock, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    metrics::{
        counter::Counter, exemplar::HistogramWithExemplars, family::Family, gauge::Gauge,
        histogram::exponential_buckets, info::Info,
    },
    registry::Registry,
};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub count: u64,
    pub total_micros: u64,
    pub max_micros: u64,
}

type Key = (String, &'static str);

fn registry() -> &'static Mutex<BTreeMap<Key, Stat>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<Key, Stat>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

pub fn record(function: &str, outcome: &'static str, elapsed: Duration) {
    super::activity::count(function, outcome);
    let exported = exported();
    exported
        .messages
        .get_or_create(&vec![
            ("function".to_owned(), function.to_owned()),
            ("outcome".to_owned(), outcome.to_owned()),
        ])
        .inc();
    // Counts without a latency (one per task of a message, a parked delivery) are recorded
    // with a zero duration: they are not handler calls.
    if !elapsed.is_zero() {
        exported
            .handler_seconds
            .get_or_create(&vec![("function".to_owned(), function.to_owned())])
            .observe(elapsed.as_secs_f64(), sampled_trace(), None);
    }
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let mut map = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let stat = map.entry((function.to_owned(), outcome)).or_default();
    stat.count += 1;
    stat.total_micros = stat.total_micros.saturating_add(micros);
    stat.max_micros = stat.max_micros.max(micros);
}

/// (function, outcome) → stat, sorted.
pub fn snapshot() -> Vec<(String, &'static str, Stat)> {
    let map = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    map.iter().map(|((f, o), s)| (f.clone(), *o, *s)).collect()
}

/// How many messages of `function` ended with `outcome` in this process.
pub fn count(function: &str, outcome: &str) -> u64 {
    snapshot()
        .into_iter()
        .filter(|(f, o, _)| f == function && *o == outcome)
        .map(|(_, _, s)| s.count)
        .sum()
}

type Labels = Vec<(String, String)>;

/// Handler latency buckets: 1 ms to ~16 s, doubling. Each bucket keeps its latest sample's
/// trace as an OpenMetrics exemplar, so a slow bucket on a dashboard opens a slow trace.
fn latency_histogram() -> HistogramWithExemplars<Labels> {
    HistogramWithExemplars::new(exponential_buckets(0.001, 2.0, 15))
}

/// The exemplar of a sample taken inside a sampled trace (`trace_id`, `span_id`: the names
/// Prometheus and Grafana look for); none when tracing is off.
fn sampled_trace() -> Option<Labels> {
    use opentelemetry::trace::TraceContextExt;
    if !paybus_telemetry::tracing_enabled() {
        return None;
    }
    let context = opentelemetry::Context::current();
    let span = context.span();
    let ids = span.span_context();
    ids.is_sampled().then(|| {
        vec![
            ("trace_id".to_owned(), ids.trace_id().to_string()),
            ("span_id".to_owned(), ids.span_id().to_string()),
        ]
    })
}

/// The in-process figures in the Prometheus client's types.
struct Exported {
    messages: Family<Labels, Counter>,
    handler_seconds:
        Family<Labels, HistogramWithExemplars<Labels>, fn() -> HistogramWithExemplars<Labels>>,
    audit_violations: Family<Labels, Counter>,
    audit_last_violations: Gauge,
    audit_last_seconds: Gauge<f64, AtomicU64>,
    audit_passes: Counter,
    external_calls: Family<Labels, Counter>,
    broker_blocked: Gauge,
    break_glass_requests: Counter,
}

fn exported() -> &'static Exported {
    static EXPORTED: OnceLock<Exported> = OnceLock::new();
    EXPORTED.get_or_init(|| Exported {
        messages: Family::default(),
        handler_seconds: Family::new_with_constructor(latency_histogram),
        audit_violations: Family::default(),
        audit_last_violations: Gauge::default(),
        audit_last_seconds: Gauge::default(),
        audit_passes: Counter::default(),
        external_calls: Family::default(),
        broker_blocked: Gauge::default(),
        break_glass_requests: Counter::default(),
    })
}

/// A request authenticated with a break-glass token (the shared secret, not the identity
/// provider): counted, so that its use is seen where the alerts look.
pub fn record_break_glass() {
    exported().break_glass_requests.inc();
}

/// The broker blocked (`true`) or unblocked one of this process's broker links
/// (`bus::link`). A process has one link, so `paybus_broker_blocked` is 1 or 0; counted rather
/// than set so that a harness running several links in one process keeps it right.
pub fn broker_link_blocked(blocked: bool) {
    let gauge = &exported().broker_blocked;
    if blocked {
        gauge.inc();
    } else {
        gauge.dec();
    }
}

/// The continuous auditor's pass: its violations by check, and the pass's own figures.
pub fn record_audit_pass(violations: &[paybus_ops::audit::Violation], duration: Duration) {
    let exported = exported();
    exported.audit_passes.inc();
    for violation in violations {
        exported
            .audit_violations
            .get_or_create(&vec![("check".to_owned(), violation.check.to_owned())])
            .inc();
    }
    exported
        .audit_last_violations
        .set(i64::try_from(violations.len()).unwrap_or(i64::MAX));
    exported.audit_last_seconds.set(duration.as_secs_f64());
}

/// What a call with a side effect elsewhere (a trade at the quote service, a partner's
/// webhook) is known to have done (principle 12): the one vocabulary every such call reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The counterparty answered that it did it.
    Done,
    /// Provably not done: refused before anything was sent, or a definitive refusal.
    NotDone,
    /// It may or may not have happened (a timeout or reset after sending, a 5xx, an answer
    /// that does not parse): whoever holds the work keeps it and asks again under the same key.
    Unknown,
}

impl Effect {
    pub fn label(self) -> &'static str {
        match self {
            Effect::Done => "done",
            Effect::NotDone => "not_done",
            Effect::Unknown => "unknown",
        }
    }
}

/// Counts one external call (`call`: the counterparty's operation, e.g. `createTrade`).
pub fn record_external_call(call: &str, effect: Effect) {
    exported()
        .external_calls
        .get_or_create(&vec![
            ("call".to_owned(), call.to_owned()),
            ("outcome".to_owned(), effect.label().to_owned()),
        ])
        .inc();
}

/// Figures read from the database at scrape time (the same in every process).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gauges {
    /// Outbox rows not yet published, and the age of the oldest (seconds).
    pub outbox_backlog: u64,
    pub outbox_oldest_seconds: f64,
    /// Messages held as newer than their consumer knew, not yet released (`crate::held`).
    pub held_messages: u64,
    /// NEW dead letters per function (what every `paybus.<function>.dlq` drained into), from
    /// the dead-letter group counts.
    pub dead_letters: Vec<(String, u64)>,
    /// Per work table: rows due for a retry now, and rows stuck (see `retry::WorkTable::stuck`).
    pub due_retries: Vec<(String, u64)>,
    pub stuck_rows: Vec<(String, u64)>,
    /// Per work table with such a status: rows parked for a human (W1's IN_DOUBT).
    pub held_for_a_human: Vec<(String, u64)>,
    /// How long ago the continuous auditor last finished a pass (any process's: the
    /// `audit_passes` table), `None` before its first.
    pub audit_last_pass_age_seconds: Option<f64>,
    /// The functions ops paused (`function_pauses`).
    pub paused_functions: Vec<String>,
    /// Per function: the due rows of its work tables (the caller that knows which function
    /// works which table fills it from [`Gauges::due_retries`]).
    pub function_due_rows: Vec<(String, u64)>,
    /// Per partner (id): 1 while its webhook circuit breaker is open or half-open. Filled by the
    /// caller that knows partners (the API), not by [`read_gauges`](crate::gauges::read_gauges).
    pub partner_breakers_not_closed: Vec<(String, u64)>,
    /// Per partner (id): 1 while its endpoint is disabled by a `410 Gone` (filled as above).
    pub partner_webhooks_disabled: Vec<(String, u64)>,
}

/// Everything in the Prometheus text format (OpenMetrics 1.0), `gauges` included.
pub fn encode(gauges: &Gauges) -> String {
    let exported = exported();
    let mut registry = Registry::with_prefix("paybus");
    registry.register(
        "build",
        "The release and the commit this process was built from (CHANGELOG.md names each \
         release's commit)",
        Info::new(vec![
            (
                "version".to_owned(),
                paybus_config::build::VERSION.to_owned(),
            ),
            ("commit".to_owned(), paybus_config::build::COMMIT.to_owned()),
        ]),
    );
    registry.register(
        "messages",
        "Messages handled, by function and outcome",
        exported.messages.clone(),
    );
    registry.register(
        "handler_seconds",
        "Handler latency by function",
        exported.handler_seconds.clone(),
    );
    registry.register(
        "audit_violations",
        "Invariant violations found by the continuous auditor, by check",
        exported.audit_violations.clone(),
    );
    registry.register(
        "audit_passes",
        "Continuous auditor passes run by this process",
        exported.audit_passes.clone(),
    );
    registry.register(
        "audit_last_pass_violations",
        "Violations found by this process's last auditor pass",
        exported.audit_last_violations.clone(),
    );
    registry.register(
        "audit_last_pass_seconds",
        "Duration of this process's last auditor pass",
        exported.audit_last_seconds.clone(),
    );
    registry.register(
        "external_calls",
        "Calls with a side effect elsewhere, by call and what they are known to have done",
        exported.external_calls.clone(),
    );
    registry.register(
        "broker_blocked",
        "1 while the broker blocks this process's connection (a resource alarm: memory or disk): nothing is published on it",
        exported.broker_blocked.clone(),
    );
    registry.register(
        "break_glass_requests",
        "Admin requests this process took with a break-glass token (PAYBUS_BREAK_GLASS), not \
         a person the identity provider vouches for",
        exported.break_glass_requests.clone(),
    );
    let backlog: Gauge = Gauge::default();
    backlog.set(i64::try_from(gauges.outbox_backlog).unwrap_or(i64::MAX));
    registry.register(
        "outbox_backlog",
        "Outbox messages not yet published",
        backlog,
    );
    let held: Gauge = Gauge::default();
    held.set(i64::try_from(gauges.held_messages).unwrap_or(i64::MAX));
    registry.register(
        "held_messages",
        "Messages held as newer than their consumer knew, waiting for a release that reads \
         their version (a rolling deploy in progress, or one rolled back)",
        held,
    );
    if let Some(age) = gauges.audit_last_pass_age_seconds {
        let last_pass: Gauge<f64, AtomicU64> = Gauge::default();
        last_pass.set(age);
        registry.register(
            "audit_last_pass_age_seconds",
            "How long ago the continuous auditor (in any process) last finished a pass",
            last_pass,
        );
    }
    let paused: Family<Labels, Gauge> = Family::default();
    for function in &gauges.paused_functions {
        paused
            .get_or_create(&vec![("function".to_owned(), function.clone())])
            .set(1);
    }
    registry.register(
        "function_paused",
        "1 for each function ops paused (paybus functions pause): its queue waits",
        paused,
    );
    let oldest: Gauge<f64, AtomicU64> = Gauge::default();
    oldest.set(gauges.outbox_oldest_seconds);
    registry.register(
        "outbox_oldest_unpublished_seconds",
        "Age of the oldest unpublished outbox message",
        oldest,
    );
    for (name, help, label, values) in [
        (
            "dead_letters",
            "NEW dead letters by function (the drained dead-letter queues), counted up to 10001: 10001 means more than 10000",
            "function",
            &gauges.dead_letters,
        ),
        (
            "due_retries",
            "Rows due for a retry now, by work table",
            "table",
            &gauges.due_retries,
        ),
        (
            "stuck_rows",
            "Rows overdue or claimed for too long, by work table",
            "table",
            &gauges.stuck_rows,
        ),
        (
            "rows_held_for_a_human",
            "Rows parked until ops act (e.g. a trade in doubt), by work table",
            "table",
            &gauges.held_for_a_human,
        ),
        (
            "function_due_rows",
            "Rows due for an attempt now in each function's work tables (its backlog of retries)",
            "function",
            &gauges.function_due_rows,
        ),
        (
            "partner_breaker_not_closed",
            "1 for each partner whose webhook circuit breaker is open or half-open",
            "partner",
            &gauges.partner_breakers_not_closed,
        ),
        (
            "partner_webhook_disabled",
            "1 for each partner whose endpoint answered 410 Gone: its notifications wait",
            "partner",
            &gauges.partner_webhooks_disabled,
        ),
    ] {
        let family: Family<Labels, Gauge> = Family::default();
        for (value_label, value) in values {
            family
                .get_or_create(&vec![(label.to_owned(), value_label.clone())])
                .set(i64::try_from(*value).unwrap_or(i64::MAX));
        }
        registry.register(name, help, family);
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

/// The `Content-Type` of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
