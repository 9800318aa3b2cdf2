//! Running a real function binary as AWS Lambda runs it: a local Lambda Runtime API (the HTTP
//! interface Lambda gives a custom runtime: `GET …/invocation/next`, `POST …/response`,
//! `POST …/error`), Amazon MQ events built from real envelopes, and the binary spawned with
//! `AWS_LAMBDA_RUNTIME_API` pointing at the fake API and `PAYBUS_*` at the test's database
//! and vhost.
//!
//! ```ignore
//! let api = RuntimeApi::start().await;
//! let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_canary"), &api, env.env_vars());
//! let answer = lambda.invoke(&api, MqEvent::new("paybus.canary").envelope(&ping).json()).await;
//! ```

use std::{
    collections::{HashMap, VecDeque},
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::{get, post},
};
use base64::Engine;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use super::outage::Relay;
use paybus_bus::{Envelope, Message};

/// What the function posted back for an invocation.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// `POST …/{request id}/response`: the invocation succeeded with this JSON.
    Response(Value),
    /// `POST …/{request id}/error`: the invocation failed (Lambda would retry the batch).
    Error(Value),
    /// `POST …/init/error`: the process failed before its first event.
    InitError(Value),
}

impl Answer {
    /// The successful response, or a panic naming what came instead.
    pub fn response(self) -> Value {
        match self {
            Answer::Response(value) => value,
            other => panic!("the invocation failed: {other:?}"),
        }
    }

    /// The error, or a panic naming the success that came instead.
    pub fn error(self) -> Value {
        match self {
            Answer::Error(value) => value,
            other => panic!("the invocation was expected to fail: {other:?}"),
        }
    }
}

struct Shared {
    /// Events waiting for the runtime's next `GET /next`.
    events: Mutex<VecDeque<(String, String)>>,
    queued: Notify,
    next_calls: mpsc::UnboundedSender<Instant>,
    answers: mpsc::UnboundedSender<(String, Answer)>,
}

/// A fake Lambda Runtime API on a free loopback port.
pub struct RuntimeApi {
    address: std::net::SocketAddr,
    shared: Arc<Shared>,
    next_calls: mpsc::UnboundedReceiver<Instant>,
    answers: mpsc::UnboundedReceiver<(String, Answer)>,
}

impl RuntimeApi {
    pub async fn start() -> Self {
        let (next_tx, next_calls) = mpsc::unbounded_channel();
        let (answers_tx, answers) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            events: Mutex::new(VecDeque::new()),
            queued: Notify::new(),
            next_calls: next_tx,
            answers: answers_tx,
        });
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .route("/2018-06-01/runtime/init/error", post(init_error))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake Runtime API");
        let address = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            address,
            shared,
            next_calls,
            answers,
        }
    }

    /// `host:port`, the value of `AWS_LAMBDA_RUNTIME_API`.
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// Queues an event; the runtime gets it on its next `GET /next`. Returns its request id.
    pub fn queue(&self, event: impl Into<String>) -> String {
        let request_id = uuid::Uuid::new_v4().to_string();
        self.shared
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push_back((request_id.clone(), event.into()));
        self.shared.queued.notify_one();
        request_id
    }

    /// When the runtime next asked for an event (the first time ends its cold start).
    pub async fn next_call(&mut self, within: Duration) -> Instant {
        tokio::time::timeout(within, self.next_calls.recv())
            .await
            .expect("the runtime asks for an event in time")
            .expect("the fake API is running")
    }

    /// Whether the function has posted nothing (not yet consumed by [`RuntimeApi::answer`]).
    pub fn no_answer(&mut self) -> bool {
        self.answers.try_recv().is_err()
    }

    /// The next answer the function posted, with the request id it answered.
    pub async fn answer(&mut self, within: Duration) -> (String, Answer) {
        tokio::time::timeout(within, self.answers.recv())
            .await
            .expect("the function answers in time")
            .expect("the fake API is running")
    }
}

async fn next(State(api): State<Arc<Shared>>) -> (HeaderMap, String) {
    let _ = api.next_calls.send(Instant::now());
    let (request_id, event) = loop {
        let notified = api.queued.notified();
        let waiting = api
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop_front();
        match waiting {
            Some(event) => break event,
            // As Lambda does while no message waits: the request stays open.
            None => notified.await,
        }
    };
    let deadline = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis()
        + 300_000;
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        headers.insert(name, value.parse().expect("a valid header value"));
    };
    set("lambda-runtime-aws-request-id", request_id);
    set("lambda-runtime-deadline-ms", deadline.to_string());
    set(
        "lambda-runtime-invoked-function-arn",
        "arn:aws:lambda:eu-central-1:123456789012:function:paybus-test".to_owned(),
    );
    set(
        "lambda-runtime-trace-id",
        "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1".to_owned(),
    );
    set("content-type", "application/json".to_owned());
    (headers, event)
}

fn json_or_text(body: &Bytes) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
}

async fn response(
    State(api): State<Arc<Shared>>,
    Path(request_id): Path<String>,
    body: Bytes,
) -> StatusCode {
    let _ = api
        .answers
        .send((request_id, Answer::Response(json_or_text(&body))));
    StatusCode::ACCEPTED
}

async fn error(
    State(api): State<Arc<Shared>>,
    Path(request_id): Path<String>,
    body: Bytes,
) -> StatusCode {
    let _ = api
        .answers
        .send((request_id, Answer::Error(json_or_text(&body))));
    StatusCode::ACCEPTED
}

async fn init_error(State(api): State<Arc<Shared>>, body: Bytes) -> StatusCode {
    let _ = api
        .answers
        .send(("init".to_owned(), Answer::InitError(json_or_text(&body))));
    StatusCode::ACCEPTED
}

/// A function binary running as a Lambda execution environment (killed on drop).
pub struct LambdaProcess {
    child: tokio::process::Child,
    /// When the process was spawned.
    pub spawned: Instant,
    /// Everything it wrote to stderr so far (its logs; also echoed with `TEST_LOG=1`).
    stderr: Arc<Mutex<String>>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl LambdaProcess {
    /// Spawns `binary` with the Lambda variables pointing at `api`, plus `vars` (e.g.
    /// `env.env_vars()`).
    pub fn spawn(binary: &str, api: &RuntimeApi, vars: HashMap<String, String>) -> Self {
        let name = std::path::Path::new(binary)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let spawned = Instant::now();
        let mut child = tokio::process::Command::new(binary)
            .env_remove("RUST_LOG")
            .envs(vars)
            .env("AWS_LAMBDA_RUNTIME_API", api.address())
            .env("AWS_LAMBDA_FUNCTION_NAME", &name)
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "512")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "test")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {binary}: {e}"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let reader = child.stderr.take().map(|pipe| {
            let copy = stderr.clone();
            let echo = std::env::var_os("TEST_LOG").is_some();
            tokio::spawn(async move {
                use tokio::io::{AsyncBufReadExt, BufReader};
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if echo {
                        eprintln!("[{name}] {line}");
                    }
                    let mut text = copy.lock().unwrap_or_else(|p| p.into_inner());
                    text.push_str(&line);
                    text.push('\n');
                }
            })
        });
        Self {
            child,
            spawned,
            stderr,
            reader,
        }
    }

    /// [`spawn`](Self::spawn) with `env`'s variables, the database reached through a
    /// [`Relay`] the test can cut (a database outage for this process alone; the shared
    /// server keeps serving every other test) and a short pool timeout, so an invocation
    /// during the outage fails in about two seconds. Returns once the process asks for its
    /// first event (its init is done): a cut is then an outage of a running environment.
    pub async fn spawn_behind_relay(
        binary: &str,
        api: &mut RuntimeApi,
        env: &super::TestEnv,
    ) -> (Self, Arc<Relay>) {
        let database = Relay::to(&env.settings.database.url).await;
        let mut vars = env.env_vars();
        vars.insert(
            "PAYBUS_DATABASE_URL".to_owned(),
            database.url(&env.settings.database.url).to_string(),
        );
        vars.insert("PAYBUS_DB_ACQUIRE_TIMEOUT_MS".to_owned(), "2000".to_owned());
        let process = Self::spawn(binary, api, vars);
        api.next_call(Duration::from_secs(30)).await;
        (process, database)
    }

    /// Hands the function one event and waits for its answer (failing the test if the
    /// process exits instead).
    pub async fn invoke(&mut self, api: &mut RuntimeApi, event: impl Into<String>) -> Answer {
        let request_id = api.queue(event);
        let answered = tokio::select! {
            answered = api.answer(Duration::from_secs(60)) => answered,
            status = self.child.wait() => panic!(
                "the function exited instead of answering ({status:?}):\n{}",
                self.stderr()
            ),
        };
        match answered {
            (id, answer) if id == request_id => answer,
            (_, init @ Answer::InitError(_)) => init,
            (id, answer) => panic!("an answer for {id}, not {request_id}: {answer:?}"),
        }
    }

    /// The outage scenario: `event` while `database` is cut (the invocation must fail), then
    /// the same event once it is back (it must succeed, as Amazon MQ's replay of the batch):
    /// the error and the response.
    pub async fn invoke_during_and_after_outage(
        &mut self,
        api: &mut RuntimeApi,
        database: &Relay,
        event: &str,
    ) -> (Value, Value) {
        database.cut();
        let failed = self.invoke(api, event).await.error();
        database.restore().await;
        let replayed = self.invoke(api, event).await.response();
        assert_eq!(failed["errorType"], "paybus.BatchError", "{failed}");
        (failed, replayed)
    }

    /// Waits (at most 30 s) for the process to exit; its exit code.
    pub async fn wait(&mut self) -> Option<i32> {
        let code = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the process exits in time")
            .expect("wait for the process")
            .code();
        // Everything it wrote, up to the end of its stderr.
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        code
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Whether the process is still running (a Lambda environment lives between invocations).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// An Amazon MQ for RabbitMQ event (`aws:rmq`), built message by message as the event source
/// mapping delivers them: bodies base64, string headers as `{"bytes": [...]}`.
#[derive(Debug, Clone)]
pub struct MqEvent {
    key: String,
    messages: Vec<Value>,
}

impl MqEvent {
    /// An event from `queue` on vhost `/`.
    pub fn new(queue: &str) -> Self {
        Self {
            key: format!("{queue}::/"),
            messages: Vec::new(),
        }
    }

    /// A message carrying `envelope`, with the AMQP properties the outbox publishes it with.
    pub fn envelope<M: Message>(self, envelope: &Envelope<M>) -> Self {
        let body = serde_json::to_vec(envelope).expect("serialise the envelope");
        let id = envelope.id.to_string();
        self.message(
            json!({
                "messageId": id,
                "correlationId": envelope.correlation_id.to_string(),
                "type": envelope.kind,
            }),
            &body,
        )
    }

    /// A message whose `data` is `data` exactly (e.g. not base64 at all).
    pub fn raw(mut self, message_id: &str, data: &str) -> Self {
        self.messages.push(json!({
            "basicProperties": properties(json!({ "messageId": message_id }), data.len()),
            "redelivered": false,
            "data": data,
        }));
        self
    }

    /// A message with `body` (base64-encoded here) and these properties over the defaults
    /// (camelCase, as in the event; `headers` values as the event encodes them).
    pub fn message(mut self, extra_properties: Value, body: &[u8]) -> Self {
        self.messages.push(json!({
            "basicProperties": properties(extra_properties, body.len()),
            "redelivered": false,
            "data": base64::engine::general_purpose::STANDARD.encode(body),
        }));
        self
    }

    /// The last message again (a duplicate in the same batch).
    pub fn repeat_last(mut self) -> Self {
        if let Some(last) = self.messages.last().cloned() {
            self.messages.push(last);
        }
        self
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    pub fn value(&self) -> Value {
        json!({
            "eventSource": "aws:rmq",
            "eventSourceArn": "arn:aws:mq:eu-central-1:123456789012:broker:paybus:b-9bcfa592-423a-4942-879d-eb284b418fc8",
            "rmqMessagesByQueue": { self.key.clone(): self.messages },
        })
    }

    pub fn json(&self) -> String {
        self.value().to_string()
    }

    /// The typed event, for calling the transport in-process.
    pub fn event(&self) -> aws_lambda_events::event::rabbitmq::RabbitMqEvent {
        serde_json::from_value(self.value()).expect("a RabbitMqEvent")
    }
}

/// A header value as the event encodes an AMQP long string.
pub fn header_text(text: &str) -> Value {
    json!({ "bytes": text.as_bytes() })
}

fn properties(extra: Value, body_size: usize) -> Value {
    let mut properties = json!({
        "contentType": "application/json", "contentEncoding": null, "headers": {},
        "deliveryMode": 2, "priority": 0, "correlationId": null, "replyTo": null,
        "expiration": null, "messageId": null, "timestamp": "Jan 5, 2026, 9:30:00 AM",
        "type": null, "userId": null, "appId": null, "clusterId": null, "bodySize": body_size,
    });
    if let (Some(properties), Some(extra)) = (properties.as_object_mut(), extra.as_object()) {
        properties.extend(extra.clone());
    }
    properties
}

/// A stand-in for the AWS Parameters and Secrets Lambda Extension: answers
/// `GET /secretsmanager/get?secretId=<id>` with `{"SecretString": value}` for the secrets it
/// holds (403 without the session token the process must send, 400 for an unknown id, as
/// Secrets Manager's error). Point a process at it with [`SecretsExtension::vars`].
pub struct SecretsExtension {
    port: u16,
}

/// The session token the fake extension insists on.
pub const SESSION_TOKEN: &str = "test-session-token";

impl SecretsExtension {
    pub async fn start(secrets: HashMap<String, String>) -> Self {
        let secrets = Arc::new(secrets);
        let app = Router::new()
            .route("/secretsmanager/get", get(secret))
            .with_state(secrets);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake extension");
        let port = listener.local_addr().expect("its address").port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { port }
    }

    /// The variables that point a process at this extension.
    pub fn vars(&self) -> HashMap<String, String> {
        HashMap::from([
            (
                "PARAMETERS_SECRETS_EXTENSION_HTTP_PORT".to_owned(),
                self.port.to_string(),
            ),
            ("AWS_SESSION_TOKEN".to_owned(), SESSION_TOKEN.to_owned()),
        ])
    }
}

async fn secret(
    State(secrets): State<Arc<HashMap<String, String>>>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<HashMap<String, String>>,
) -> (StatusCode, String) {
    if headers
        .get("x-aws-parameters-secrets-token")
        .and_then(|v| v.to_str().ok())
        != Some(SESSION_TOKEN)
    {
        return (StatusCode::FORBIDDEN, "missing session token".to_owned());
    }
    let id = query.get("secretId").cloned().unwrap_or_default();
    match secrets.get(&id) {
        Some(value) => (
            StatusCode::OK,
            json!({ "ARN": id, "Name": id, "SecretString": value }).to_string(),
        ),
        None => (
            StatusCode::BAD_REQUEST,
            format!(
                "ResourceNotFoundException: Secrets Manager can't find the specified secret {id}"
            ),
        ),
    }
}
