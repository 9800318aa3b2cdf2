//! `trace_id` and `span_id` on every JSON log line written inside a sampled trace, so a log
//! search and the tracing backend open each other (the OpenTelemetry log data model's field
//! names, top-level, as log pipelines index them).

use opentelemetry::trace::TraceContextExt;
use tracing::{Event, Subscriber};
use tracing_subscriber::{
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    registry::LookupSpan,
};

/// Wraps the JSON formatter: its line, with the ids spliced in after the opening brace.
pub struct WithTraceIds<F> {
    inner: F,
}

impl<F> WithTraceIds<F> {
    pub fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        // Entering a span activates its OpenTelemetry context (tracing-opentelemetry's context
        // activation), so the current context is the event's span's.
        let context = opentelemetry::Context::current();
        let span = context.span();
        let ids = span.span_context();
        if !ids.is_valid() {
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::with_capacity(256);
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                write!(
                    writer,
                    "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",",
                    ids.trace_id(),
                    ids.span_id()
                )?;
                writer.write_str(rest)
            }
            None => writer.write_str(&line),
        }
    }
}
