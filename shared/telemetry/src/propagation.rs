//! W3C Trace Context (`traceparent`, `tracestate`) carried across paybus's boundaries: HTTP
//! requests in and out, the outbox row, the AMQP message headers (also what Amazon MQ hands a
//! Lambda), and the link to an invocation's X-Ray trace (docs/observability.md).

use std::{collections::HashMap, future::Future};

use opentelemetry::{
    Context, global,
    propagation::{Extractor, TextMapPropagator as _},
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

use super::otlp::tracing_enabled;

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// A trace context as it travels: the two W3C headers, both absent outside a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl TraceHeaders {
    /// The current span's context; empty when tracing is off (no lookup at all then).
    pub fn current() -> Self {
        if !tracing_enabled() {
            return Self::default();
        }
        Self::of(&tracing::Span::current().context())
    }

    /// The context a message carrying `correlation_id` continues: inside [`within_batch`], the
    /// span of the delivery of the batch that carries the same correlation id (the message it
    /// was caused by); elsewhere, or when no delivery of the batch carries it, the current
    /// span's.
    pub fn caused_by(correlation_id: Uuid) -> Self {
        if !tracing_enabled() {
            return Self::default();
        }
        BATCH_CAUSES
            .try_with(|causes| causes.get(&correlation_id).cloned())
            .ok()
            .flatten()
            .unwrap_or_else(Self::current)
    }

    /// The context of `span` (an outgoing call's client span, before it is entered).
    pub fn of_span(span: &tracing::Span) -> Self {
        if !tracing_enabled() {
            return Self::default();
        }
        Self::of(&span.context())
    }

    fn of(context: &Context) -> Self {
        if !context.span().span_context().is_valid() {
            return Self::default();
        }
        let mut map = HashMap::new();
        global::get_text_map_propagator(|propagator| propagator.inject_context(context, &mut map));
        Self {
            traceparent: map.remove(TRACEPARENT),
            // The column's width and the W3C limit; a longer one came from a remote client and
            // would fail the outbox INSERT, which must never fail over telemetry.
            tracestate: map
                .remove(TRACESTATE)
                .filter(|state| !state.is_empty() && state.len() <= 512),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.traceparent.is_none()
    }

    /// The remote span these headers name, if they name a valid one. Parsed by the SDK's own
    /// propagator whatever the global one is, so a malformed header is simply no parent.
    pub fn remote(&self) -> Option<SpanContext> {
        let traceparent = self.traceparent.as_deref()?;
        let carrier = Pair {
            traceparent,
            tracestate: self.tracestate.as_deref(),
        };
        let context = TraceContextPropagator::new().extract(&carrier);
        let remote = context.span().span_context().clone();
        remote.is_valid().then_some(remote)
    }

    pub fn from_http(headers: &reqwest::header::HeaderMap) -> Self {
        let text = |name| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        Self {
            traceparent: text(TRACEPARENT),
            tracestate: text(TRACESTATE),
        }
    }

    /// Adds the headers to a built request.
    pub fn on_headers(&self, headers: &mut reqwest::header::HeaderMap) {
        let mut put = |name, value: &Option<String>| {
            if let Some(value) = value
                && let Ok(value) = reqwest::header::HeaderValue::from_str(value)
            {
                headers.insert(name, value);
            }
        };
        put(TRACEPARENT, &self.traceparent);
        put(TRACESTATE, &self.tracestate);
    }

    /// Adds the headers to an outgoing request (the quote service's, a webhook's).
    pub fn on_request(&self, mut request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(traceparent) = &self.traceparent {
            request = request.header(TRACEPARENT, traceparent);
        }
        if let Some(tracestate) = &self.tracestate {
            request = request.header(TRACESTATE, tracestate);
        }
        request
    }
}

tokio::task_local! {
    /// The trace context of each delivery of the batch being handled, by correlation id.
    static BATCH_CAUSES: HashMap<Uuid, TraceHeaders>;
}

/// Runs `handling` (a handler's batch) so that each message it sends continues the trace of
/// the delivery that caused it ([`TraceHeaders::caused_by`]), not the trace of the span the
/// batch runs in: one batch's transaction writes the notifications of up to sixteen
/// withdrawals, and each belongs to its own withdrawal's trace. `causes` maps each delivery's
/// correlation id to its span's context; the first of two deliveries that share one wins (a
/// redelivered duplicate, the same flow).
pub async fn within_batch<F: Future>(
    causes: HashMap<Uuid, TraceHeaders>,
    handling: F,
) -> F::Output {
    BATCH_CAUSES.scope(causes, handling).await
}

struct Pair<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Pair<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(self.traceparent),
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// The client span of an outgoing HTTP call (`call` names it: `quote.create_trade`,
/// `webhook`). Only the server's address is recorded, never the path or query: a partner's
/// webhook URL may carry a token of theirs. Record `http.response.status_code` on it as an
/// `i64`: tracing-opentelemetry exports an unsigned integer as its text.
pub fn http_client_span(call: &str, method: &str, url: &str) -> tracing::Span {
    let server = url::Url::parse(url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
        .unwrap_or_default();
    tracing::info_span!(
        "http_call",
        otel.name = format!("{method} {call}"),
        otel.kind = "client",
        http.request.method = %method,
        server.address = %server,
        paybus.call = %call,
        http.response.status_code = tracing::field::Empty,
    )
}

/// Makes `span` a child of the remote context (it must not have been entered yet). No-op when
/// tracing is off or the headers name no valid span.
pub fn continue_trace(span: &tracing::Span, remote: &TraceHeaders) {
    if !tracing_enabled() {
        return;
    }
    if let Some(parent) = remote.remote() {
        let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    }
}

/// Links `span` to the remote context instead of parenting it: a message's redelivery, the
/// other messages of a batch, an invocation's X-Ray trace.
pub fn link_to(span: &tracing::Span, remote: &TraceHeaders) {
    if !tracing_enabled() {
        return;
    }
    if let Some(linked) = remote.remote() {
        span.add_link(linked);
    }
}

/// Links `span` to another span of this process (a batch's message spans and the batch's span).
pub fn link_to_span(span: &tracing::Span, other: &tracing::Span) {
    if !tracing_enabled() {
        return;
    }
    let linked = other.context().span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Links `span` to the Lambda invocation's X-Ray trace (`_X_AMZN_TRACE_ID`, `Root=1-<8 hex>-<24
/// hex>;Parent=<16 hex>;Sampled=<0|1>`): the X-Ray trace id is a valid W3C trace id once its
/// dashes go, so the tracing backend can show both sides.
pub fn link_to_xray(span: &tracing::Span, amzn_trace_id: &str) {
    if !tracing_enabled() {
        return;
    }
    if let Some(linked) = xray_span_context(amzn_trace_id) {
        span.add_link(linked);
    }
}

fn xray_span_context(amzn_trace_id: &str) -> Option<SpanContext> {
    let mut root = None;
    let mut parent = None;
    let mut sampled = false;
    for part in amzn_trace_id.split(';') {
        match part.trim().split_once('=') {
            Some(("Root", value)) => root = Some(value),
            Some(("Parent", value)) => parent = Some(value),
            Some(("Sampled", value)) => sampled = value == "1",
            _ => {}
        }
    }
    let mut pieces = root?.split('-');
    let (Some("1"), Some(time), Some(unique), None) =
        (pieces.next(), pieces.next(), pieces.next(), pieces.next())
    else {
        return None;
    };
    let trace_id = TraceId::from_hex(&format!("{time}{unique}")).ok()?;
    let span_id = SpanId::from_hex(parent?).ok()?;
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let context = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_names_its_remote_span() {
        let headers = TraceHeaders {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            tracestate: Some("vendor=1".into()),
        };
        let remote = headers.remote().unwrap();
        assert_eq!(
            remote.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(remote.span_id().to_string(), "00f067aa0ba902b7");
        assert!(remote.is_sampled() && remote.is_remote());
        assert_eq!(remote.trace_state().header(), "vendor=1");
    }

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            let headers = TraceHeaders {
                traceparent: Some(bad.into()),
                tracestate: None,
            };
            assert_eq!(headers.remote(), None, "{bad:?}");
        }
        assert_eq!(TraceHeaders::default().remote(), None);
    }

    #[test]
    fn an_xray_trace_id_becomes_a_span_context() {
        let linked = xray_span_context(
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        )
        .unwrap();
        assert_eq!(
            linked.trace_id().to_string(),
            "5759e988bd862e3fe1be46a994272793"
        );
        assert_eq!(linked.span_id().to_string(), "53995c3f42cd8ad8");
        assert!(linked.is_sampled());
        assert_eq!(
            xray_span_context("Root=1-5759e988-bd862e3fe1be46a994272793"),
            None
        );
        assert_eq!(
            xray_span_context("Root=2-x-y;Parent=53995c3f42cd8ad8"),
            None
        );
        assert_eq!(xray_span_context("nonsense"), None);
    }
}
