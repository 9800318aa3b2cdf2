//! Tracing set-up: text for people at a terminal, JSON for Lambda and log pipelines, and
//! OpenTelemetry traces when the standard `OTEL_*` variables ask for them (docs/observability.md).

mod log_ids;
mod otlp;
pub mod propagation;

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use paybus_config::LogFormat;

pub use otlp::{flush, shutdown, tracing_enabled};
pub use propagation::TraceHeaders;

/// Installs the global subscriber once; `RUST_LOG` overrides the default `info` level.
/// Calling it again (tests, embedded runners) is harmless. Logs go to stderr, so a command's
/// own output (`paybus audit`, `bench`, `catalog`, `sign`) stays alone on stdout; Lambda
/// captures both. With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set, spans are
/// exported over OTLP/HTTP too, and every JSON line inside a trace carries `trace_id` and
/// `span_id`; unset, no OpenTelemetry layer is installed at all.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin=warn"));
    let traces = otlp::install_from_env().map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
    });
    let registry = tracing_subscriber::registry().with(filter).with(traces);
    let _ = match format {
        // Colour only for a person at a terminal: in files and pipes escape codes are noise.
        LogFormat::Text => registry
            .with(
                fmt::layer()
                    .with_target(false)
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .map_event_format(log_ids::WithTraceIds::new),
            )
            .try_init(),
    };
}

/// An error and its whole cause chain on one line (`error: cause: cause`), each cause once:
/// operators grep logs, and a wrapped error whose cause sits on a second line is the one
/// nobody reads.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("while confirming withdrawal 7")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_chain_is_one_line_with_each_cause_once() {
        let error = Outer(std::io::Error::other("connection\nrefused"));
        assert_eq!(
            one_line(&error),
            "while confirming withdrawal 7: connection refused"
        );
    }
}
