//! Tracing set-up: text for people at a terminal, JSON for Lambda and log pipelines.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::config::LogFormat;

/// Installs the global subscriber once; `RUST_LOG` overrides the default `info` level.
/// Calling it again (tests, embedded runners) is harmless. Logs go to stderr, so a command's
/// own output (`paybus audit`, `bench`, `catalog`, `sign`) stays alone on stdout; Lambda
/// captures both.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin=warn"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry
            .with(fmt::layer().with_target(false).with_writer(std::io::stderr))
            .try_init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
            )
            .try_init(),
    };
}
