//! The OpenTelemetry SDK, set up from the standard environment variables only
//! (<https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/>):
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` turn export on (OTLP over
//! HTTP/protobuf, the one protocol built in), `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
//! name the process, `OTEL_TRACES_SAMPLER` / `_ARG` sample, `OTEL_EXPORTER_OTLP_HEADERS` and
//! `_TIMEOUT` reach the collector, `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn
//! it off. Unset, nothing is installed: no layer, no exporter thread, no context lookups. The
//! resource always carries the build (`service.version`, `vcs.ref.head.revision`).

use std::sync::{
    OnceLock,
    atomic::{AtomicBool, Ordering},
};

use opentelemetry::{KeyValue, global, trace::TracerProvider as _};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    trace::{SdkTracer, SdkTracerProvider},
};
use paybus_config::build;

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are being exported (checked before any context work, so tracing off costs a
/// load of one flag).
pub fn tracing_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// What the environment asks for; `Err` names a setting this build cannot honour.
fn wanted(var: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    let set = |name: &str| var(name).is_some_and(|value| !value.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        Some("none") => return Ok(false),
        None | Some("" | "otlp") => {}
        Some(other) => {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={other:?}: only \"otlp\" (or \"none\") is built in"
            ));
        }
    }
    if let Some(protocol) = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .filter(|p| p.trim() != "http/protobuf")
    {
        return Err(format!(
            "OTLP protocol {protocol:?}: only \"http/protobuf\" is built in"
        ));
    }
    Ok(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Builds and installs the tracer provider when the environment asks for export; the tracer
/// for the `tracing` layer. A setting that cannot be honoured is reported on stderr and the
/// process runs without export: traces are an aid, never a reason not to move money.
pub(super) fn install_from_env() -> Option<SdkTracer> {
    if let Some(provider) = PROVIDER.get() {
        return Some(provider.tracer("paybus"));
    }
    match wanted(|name| std::env::var(name).ok()) {
        Ok(false) => return None,
        Ok(true) => {}
        Err(refused) => {
            eprintln!("paybus: OpenTelemetry export off: {refused}");
            return None;
        }
    }
    let exporter = match SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()
    {
        Ok(exporter) => exporter,
        Err(error) => {
            eprintln!("paybus: OpenTelemetry export off: {error}");
            return None;
        }
    };
    // The build is a fact of the binary, so it overrides OTEL_RESOURCE_ATTRIBUTES; the
    // commit's key is the semantic conventions' (the `vcs.ref` entity).
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("service.version", build::VERSION),
        KeyValue::new("vcs.ref.head.revision", build::COMMIT),
    ]);
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name(default_service_name());
    }
    // The sampler comes from OTEL_TRACES_SAMPLER through the SDK's own default config.
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    global::set_text_map_propagator(TraceContextPropagator::new());
    global::set_tracer_provider(provider.clone());
    let tracer = provider.tracer("paybus");
    if PROVIDER.set(provider).is_ok() {
        ENABLED.store(true, Ordering::Relaxed);
    }
    Some(tracer)
}

/// The process's own name when `OTEL_SERVICE_NAME` is not set: `paybus-confirm-withdrawal`,
/// `paybus`, or the Lambda function's name.
fn default_service_name() -> String {
    std::env::var("AWS_LAMBDA_FUNCTION_NAME")
        .ok()
        .unwrap_or_else(|| {
            std::env::args()
                .next()
                .and_then(|path| {
                    std::path::Path::new(&path)
                        .file_name()
                        .map(|name| name.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "paybus".to_owned())
        })
}

/// Sends the spans ended so far. A Lambda environment is frozen between invocations, so the
/// adapter calls this before answering each one; the batch processor's thread would otherwise
/// hold them until the next thaw, or lose them with the environment. Blocking: call it from a
/// blocking task.
pub fn flush() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.force_flush()
    {
        tracing::warn!(%error, "spans not exported");
    }
}

/// Flushes and stops the exporter (the process is ending). Blocking, as [`flush`].
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get() {
        let _ = provider.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::wanted;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn export_is_off_unless_an_endpoint_is_set() {
        assert_eq!(wanted(env(&[])), Ok(false));
        assert_eq!(wanted(env(&[("OTEL_SERVICE_NAME", "x")])), Ok(false));
        assert_eq!(
            wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])),
            Ok(true)
        );
        assert_eq!(
            wanted(env(&[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:4318/v1/traces"
            )])),
            Ok(true)
        );
    }

    #[test]
    fn the_standard_switches_turn_it_off() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        assert_eq!(
            wanted(env(&[endpoint, ("OTEL_SDK_DISABLED", "true")])),
            Ok(false)
        );
        assert_eq!(
            wanted(env(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")])),
            Ok(false)
        );
        assert_eq!(
            wanted(env(&[endpoint, ("OTEL_SDK_DISABLED", "false")])),
            Ok(true)
        );
    }

    #[test]
    fn what_is_not_built_in_is_named() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let grpc = wanted(env(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]));
        assert!(grpc.is_err_and(|e| e.contains("http/protobuf")));
        let zipkin = wanted(env(&[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")]));
        assert!(zipkin.is_err_and(|e| e.contains("otlp")));
    }
}
