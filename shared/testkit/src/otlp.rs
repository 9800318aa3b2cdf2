//! A real OTLP/HTTP receiver for tests: an HTTP server on a free loopback port answering
//! `POST /v1/traces` as a collector does, decoding each export with the OpenTelemetry
//! project's own protobuf types (`opentelemetry-proto`), and keeping the spans.
//!
//! ```ignore
//! let receiver = OtlpReceiver::start().await;
//! command.envs(receiver.env_vars("paybus-run"));
//! let spans = receiver.wait_for(Duration::from_secs(20), |spans| spans.len() > 3).await;
//! ```

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::post};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse},
    common::v1::{AnyValue, KeyValue, any_value::Value},
};
use prost::Message as _;

/// One span as the receiver got it; ids in lowercase hex, as `traceparent` spells them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The resource's `service.name`.
    pub service: String,
    /// Every attribute of the resource, as text (`service.version`, ...).
    pub resource: HashMap<String, String>,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP's `SpanKind` (2 server, 3 client, 5 consumer).
    pub kind: i32,
    /// Each attribute's value as text, whatever its type.
    pub attributes: HashMap<String, String>,
    /// The attributes exported as integers (OTLP's `int_value`).
    pub integers: HashMap<String, i64>,
    /// `(trace id, span id)` of each link.
    pub links: Vec<(String, String)>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// The attribute `key` when it was exported as an integer; `None` when it is absent or of
    /// another type (a number exported as text included).
    pub fn integer(&self, key: &str) -> Option<i64> {
        self.integers.get(key).copied()
    }
}

type Received = Arc<Mutex<Vec<ReceivedSpan>>>;

pub struct OtlpReceiver {
    pub endpoint: String,
    received: Received,
    server: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let received = Received::default();
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(received.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let address = listener.local_addr().expect("the receiver's address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            endpoint: format!("http://{address}"),
            received,
            server,
        }
    }

    /// The standard variables that make a paybus process export here, quickly (a 100 ms batch
    /// delay instead of 5 s).
    pub fn env_vars(&self, service: &str) -> HashMap<String, String> {
        HashMap::from([
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
                self.endpoint.clone(),
            ),
            ("OTEL_SERVICE_NAME".to_owned(), service.to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
        ])
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.received
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The spans once `done` holds for them, or a panic listing what came within `timeout`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                started.elapsed() < timeout,
                "the spans expected never arrived; received: {:#?}",
                spans
                    .iter()
                    .map(|s| (&s.service, &s.name, &s.trace_id, &s.parent_span_id))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn export(State(received): State<Received>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .as_ref()
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    service: service.clone(),
                    resource: resource.clone(),
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    integers: span
                        .attributes
                        .iter()
                        .filter_map(
                            |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(Value::IntValue(n)) => Some((kv.key.clone(), *n)),
                                _ => None,
                            },
                        )
                        .collect(),
                    links: span
                        .links
                        .iter()
                        .map(|link| (hex::encode(&link.trace_id), hex::encode(&link.span_id)))
                        .collect(),
                });
            }
        }
    }
    received
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .extend(spans);
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn attributes(pairs: &[KeyValue]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
