//! The deploy step: applies the database migrations and declares the RabbitMQ topology of every
//! catalog function, so no function consumes a queue that does not exist or runs against a
//! schema it does not know. In AWS it is a Lambda behind a CloudFormation custom resource that
//! runs before any other function is created or updated; outside Lambda it runs once and exits,
//! as `paybus migrate && paybus topology` do ([`main`], [`Report`]).
//!
//! Its answers to CloudFormation ([`Request`], [`Response`]; infra/aws/README.md, "Migrations and
//! topology"): it always answers (a custom resource without one holds the stack until its
//! timeout), every error a `FAILED` with its reason. Create and Update migrate, seal plaintext
//! webhook secrets and declare the topology; a database ahead of this code (an older release
//! deployed again) is `SUCCESS` with nothing to apply. An Update to an older `Version` is a
//! rollback: migrations only go forward, so it answers `SUCCESS` without touching the database,
//! declaring the older queues' bindings again only when the failed deploy changed them (never a
//! `FAILED`, which would leave `UPDATE_ROLLBACK_FAILED`). Delete, and any other request type, do
//! nothing.

use std::{collections::BTreeMap, process::ExitCode, time::Duration};

use lambda_runtime::{LambdaEvent, service_fn};
use paybus_bus::{Services, StartupError, topology};
use paybus_config::{LogFormat, Settings, Vars, sealed};
use paybus_db as db;
use paybus_runtime::function::{self, BuildError, FunctionError};
use paybus_telemetry as telemetry;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The custom resource's physical id on Create: an Update echoes the one it was given, so
/// CloudFormation never takes it for a replacement (and never sends a Delete for an old one).
pub const PHYSICAL_RESOURCE_ID: &str = "paybus-migration";

/// CloudFormation's limit on a whole answer is 4 KiB; the reason is most of it.
const MAX_REASON: usize = 1_000;

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Migrations known to this code (every one is applied after a run).
    pub migrations: usize,
    /// Migrations the database had applied that this code does not know, newer than all it
    /// knows (a later release's): none was applied then.
    pub ahead: Vec<i64>,
    /// Function queues declared (one per shard), each function with its dead-letter queue.
    pub queues: usize,
    /// Partners whose plaintext webhook secret this run sealed.
    pub sealed_secrets: u64,
    /// Queues of an earlier shard layout, now unbound, that still hold messages (to drain).
    pub retired: Vec<(String, u32)>,
}

impl Report {
    fn reason(&self) -> String {
        let mut reason = self.applied();
        if !self.retired.is_empty() {
            let retired: Vec<String> = self
                .retired
                .iter()
                .map(|(queue, n)| format!("{queue} ({n})"))
                .collect();
            reason.push_str(&format!(
                "; queues of an earlier shard layout still hold messages, drain them with `paybus topology --drain-retired`: {}",
                retired.join(", ")
            ));
        }
        reason
    }

    fn applied(&self) -> String {
        match self.ahead.as_slice() {
            [] => format!(
                "migrations applied ({} known); topology declared ({} function queue(s))",
                self.migrations, self.queues
            ),
            ahead => format!(
                "the database is ahead of this release ({} newer migration(s) applied, the newest {}): nothing to apply, as migrations only go forward; topology declared ({} function queue(s))",
                ahead.len(),
                ahead.iter().max().copied().unwrap_or_default(),
                self.queues
            ),
        }
    }
}

/// Applies every pending migration (none when the database is ahead of this code), declares
/// the exchanges and every catalog function's queues in the settings' shard layout, and
/// retires those of `earlier` (the queue names declared before, e.g. the old `Queues` of a
/// CloudFormation Update) that this layout does not have (all idempotent).
pub async fn migrate_and_declare(
    settings: &Settings,
    earlier: &[String],
) -> Result<Report, FunctionError> {
    let shards = &settings.broker.shards;
    paybus_catalog::check_shards(shards)?;
    let services = Services::connect(settings.clone()).await?;
    let ahead = db::migrations_ahead(&services.pool)
        .await
        .map_err(StartupError::from)?;
    let mut sealed_secrets = 0;
    if ahead.is_empty() {
        paybus_runtime::migrations::apply_within(
            &services.pool,
            settings.database.migration_lock_wait,
        )
        .await
        .map_err(StartupError::from)?;
        sealed_secrets = seal_plaintext_secrets(&services.pool, &settings.vars).await?;
    } else {
        tracing::warn!(
            ?ahead,
            "the database has migrations newer than this release: nothing to apply"
        );
    }
    let queues = paybus_catalog::queues(shards);
    services.declare_topology(&queues).await?;
    let earlier = topology::layout_of(earlier, &paybus_catalog::queues(&Default::default()));
    let retired = services
        .retire(&queues, &earlier)
        .await?
        .into_iter()
        .filter(|r| r.messages > 0)
        .map(|r| (r.queue, r.messages))
        .collect();
    let report = Report {
        migrations: db::MIGRATOR.iter().count(),
        ahead,
        queues: queues.len(),
        sealed_secrets,
        retired,
    };
    tracing::info!(
        migrations = report.migrations,
        queues = report.queues,
        "migrations applied and topology declared"
    );
    Ok(report)
}

/// The data step after the migrations: every plaintext `partners.webhook_secret` sealed
/// under `PAYBUS_SECRETS_KEY` (read here from `vars`, the settings' reading with the secrets
/// fetched, as only this step needs it). Returns how many.
pub async fn seal_plaintext_secrets(
    pool: &sqlx::MySqlPool,
    vars: &Vars,
) -> Result<u64, FunctionError> {
    let sealer = sealed::Sealer::read(
        vars.secret(sealed::VAR_SECRETS_KEY, sealed::KEY_MIN_CHARS)?,
        vars,
    )?;
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| StartupError::from(db::DbError::DataMigration(e)))?;
    let done = paybus_partners::webhook_secrets::seal_plaintext(&mut conn, sealer.as_ref())
        .await
        .map_err(|e| FunctionError::Service(Box::new(e)))?;
    if done.sealed > 0 {
        tracing::info!(partners = done.sealed, "plaintext webhook secrets sealed");
    }
    Ok(done.sealed)
}

/// Why an invocation could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum InvocationError {
    #[error(transparent)]
    Function(#[from] FunctionError),
    #[error("not a CloudFormation custom-resource request: {0}")]
    BadRequest(serde_json::Error),
    #[error("CloudFormation's response URL refused the answer: {0}")]
    Respond(String),
}

impl From<InvocationError> for lambda_runtime::Diagnostic {
    fn from(error: InvocationError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: "paybus.MigrateError".to_owned(),
            error_message: telemetry::one_line(&error),
        }
    }
}

/// A custom-resource request, as CloudFormation sends it (every property value a string).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Request {
    pub request_type: String,
    #[serde(rename = "ResponseURL")]
    pub response_url: String,
    pub stack_id: String,
    pub request_id: String,
    pub logical_resource_id: String,
    /// Absent on Create.
    #[serde(default)]
    pub physical_resource_id: Option<String>,
    #[serde(default)]
    pub resource_properties: Value,
    /// Update only: the properties before it.
    #[serde(default)]
    pub old_resource_properties: Option<Value>,
}

/// `SUCCESS` or `FAILED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Success,
    Failed,
}

/// The response body CloudFormation documents for a custom resource (PUT to `ResponseURL`).
/// `Reason` is always a text: required for `FAILED`, and shown in the stack's events for
/// `SUCCESS`. `NoEcho` is left out (optional, false).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Response {
    pub status: Status,
    pub reason: String,
    pub physical_resource_id: String,
    pub stack_id: String,
    pub request_id: String,
    pub logical_resource_id: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
}

/// One invocation: a CloudFormation custom-resource request (answered at its `ResponseURL`),
/// or a direct invocation (answered with the report).
pub async fn handle(event: Value, client: &reqwest::Client) -> Result<Value, InvocationError> {
    if event.get("RequestType").is_none() {
        let settings = function::settings().await?;
        let report = migrate_and_declare(&settings, &[]).await?;
        return Ok(serde_json::to_value(report).unwrap_or_default());
    }
    let request: Request = serde_json::from_value(event).map_err(InvocationError::BadRequest)?;
    let response = answer(&request).await;
    let body = serde_json::to_string(&response).map_err(InvocationError::BadRequest)?;
    // A presigned S3 URL: no content type (it is part of the signature), the length set.
    let reply = client
        .put(&request.response_url)
        .body(body)
        .send()
        .await
        .map_err(|e| InvocationError::Respond(e.to_string()))?;
    if !reply.status().is_success() {
        return Err(InvocationError::Respond(format!("HTTP {}", reply.status())));
    }
    Ok(serde_json::json!({ "status": response.status, "reason": response.reason }))
}

/// What a request asks of this code.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Work {
    Migrate,
    /// A rollback; `redeclare` when the rolled-back deploy had changed the queues.
    RollBack {
        redeclare: bool,
    },
    Nothing(&'static str),
}

fn work(request: &Request) -> Work {
    match request.request_type.as_str() {
        "Create" => Work::Migrate,
        "Update" => {
            let old = request.old_resource_properties.as_ref();
            match old {
                Some(old) if is_rollback(&request.resource_properties, old) => Work::RollBack {
                    redeclare: request.resource_properties.get("Queues") != old.get("Queues"),
                },
                _ => Work::Migrate,
            }
        }
        "Delete" => Work::Nothing("deleting the stack never touches the database or the broker"),
        // A request type CloudFormation may add later: answering beats holding the stack.
        _ => Work::Nothing("not a request type this release knows: nothing done"),
    }
}

/// The answer to a custom-resource request.
pub async fn answer(request: &Request) -> Response {
    let mut response = Response {
        status: Status::Success,
        reason: String::new(),
        physical_resource_id: request
            .physical_resource_id
            .clone()
            .unwrap_or_else(|| PHYSICAL_RESOURCE_ID.to_owned()),
        stack_id: request.stack_id.clone(),
        request_id: request.request_id.clone(),
        logical_resource_id: request.logical_resource_id.clone(),
        data: BTreeMap::new(),
    };
    let work = work(request);
    tracing::info!(request_type = %request.request_type, ?work, "custom resource request");
    response.reason = match work {
        Work::Nothing(why) => why.to_owned(),
        Work::RollBack { redeclare: false } => {
            "a rollback: migrations only go forward and the older release runs on the newer schema; nothing changed".to_owned()
        }
        Work::RollBack { redeclare: true } => match redeclare_for_rollback(&old_queues(request)).await {
            Ok(queues) => format!(
                "a rollback: migrations only go forward, nothing applied; the rolled-back deploy had changed the queues, so this release's {queues} function queue(s) were declared again"
            ),
            Err(error) => {
                let error = telemetry::one_line(&error);
                tracing::error!(%error, "rollback: the older queues could not be declared again");
                format!(
                    "a rollback: migrations only go forward, nothing applied; declaring this release's queues again failed ({error}): run `paybus topology` or invoke this function directly"
                )
            }
        },
        Work::Migrate => match migrate_for_cloudformation(&old_queues(request)).await {
            Ok(report) => {
                response.data = BTreeMap::from([
                    ("Migrations".to_owned(), report.migrations.to_string()),
                    ("Queues".to_owned(), report.queues.to_string()),
                ]);
                report.reason()
            }
            Err(error) => {
                let reason = telemetry::one_line(&error);
                tracing::error!(%reason, "custom resource: migration failed");
                response.status = Status::Failed;
                reason
            }
        },
    };
    response.reason = response.reason.chars().take(MAX_REASON).collect();
    response
}

/// The `Queues` the request replaces (an Update's old properties; none otherwise).
fn old_queues(request: &Request) -> Vec<String> {
    request
        .old_resource_properties
        .as_ref()
        .and_then(|old| old.get("Queues"))
        .and_then(Value::as_array)
        .map(|queues| {
            queues
                .iter()
                .filter_map(|q| q.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn migrate_for_cloudformation(earlier: &[String]) -> Result<Report, FunctionError> {
    let settings = function::settings().await?;
    migrate_and_declare(&settings, earlier).await
}

/// The topology of this (older) release declared again (its shard layout), the rolled-back
/// deploy's queues (`rolled_back`) retired, migrations untouched.
async fn redeclare_for_rollback(rolled_back: &[String]) -> Result<usize, FunctionError> {
    let settings = function::settings().await?;
    let queues = paybus_catalog::queues(&settings.broker.shards);
    let services = Services::connect(settings).await?;
    services.declare_topology(&queues).await?;
    let earlier = topology::layout_of(rolled_back, &paybus_catalog::queues(&Default::default()));
    services.retire(&queues, &earlier).await?;
    Ok(queues.len())
}

/// The Lambda version number in a `Version` property: the version's ARN (what
/// `Ref: <Function>.Version` gives: `arn:aws:lambda:<region>:<account>:function:<name>:<n>`)
/// or a bare number.
fn version_number(properties: &Value) -> Option<u64> {
    let version = match properties.get("Version")? {
        Value::String(text) => text.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    version.rsplit(':').next()?.parse().ok()
}

/// A rollback puts back an older `Version` (Lambda version numbers only grow).
fn is_rollback(properties: &Value, old_properties: &Value) -> bool {
    matches!(
        (version_number(properties), version_number(old_properties)),
        (Some(new), Some(old)) if new < old
    )
}

/// The whole `main` of the `migrate` binary.
pub fn main() -> ExitCode {
    function::block_on(run())
}

async fn run() -> Result<(), FunctionError> {
    if !paybus_config::in_lambda() {
        let settings = function::settings().await?;
        let report = migrate_and_declare(&settings, &[]).await?;
        println!("{}", report.reason());
        return Ok(());
    }
    telemetry::init(LogFormat::Json);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| BuildError::Client {
            what: "the HTTP client for CloudFormation's answers",
            source: Box::new(e),
        })?;
    let client = &client;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        handle(event.payload, client).await
    }))
    .await
    .map_err(FunctionError::Lambda)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str =
        "arn:aws:lambda:eu-central-1:123456789012:function:paybus-MigrateFunction-AbC";

    fn v(version: &str) -> Value {
        serde_json::json!({ "Version": version })
    }

    #[test]
    fn an_older_version_is_a_rollback_whether_a_number_or_an_arn() {
        assert!(is_rollback(&v("3"), &v("4")));
        assert!(!is_rollback(&v("5"), &v("4")));
        assert!(!is_rollback(&v("4"), &v("4")));
        assert!(!is_rollback(&serde_json::json!({}), &v("4")));
        // What `Ref: MigrateFunction.Version` really is.
        assert!(is_rollback(
            &v(&format!("{ARN}:9")),
            &v(&format!("{ARN}:10"))
        ));
        assert!(!is_rollback(
            &v(&format!("{ARN}:11")),
            &v(&format!("{ARN}:10"))
        ));
        assert!(!is_rollback(
            &v(&format!("{ARN}:$LATEST")),
            &v(&format!("{ARN}:10"))
        ));
    }

    #[test]
    fn a_rollback_redeclares_only_when_the_queues_changed() {
        let request = |queues: &[&str], old_queues: &[&str]| Request {
            request_type: "Update".to_owned(),
            response_url: String::new(),
            stack_id: String::new(),
            request_id: String::new(),
            logical_resource_id: String::new(),
            physical_resource_id: Some(PHYSICAL_RESOURCE_ID.to_owned()),
            resource_properties: serde_json::json!({"Version": format!("{ARN}:1"), "Queues": queues}),
            old_resource_properties: Some(
                serde_json::json!({"Version": format!("{ARN}:2"), "Queues": old_queues}),
            ),
        };
        assert_eq!(
            work(&request(&["paybus.a"], &["paybus.a"])),
            Work::RollBack { redeclare: false }
        );
        assert_eq!(
            work(&request(&["paybus.a"], &["paybus.a.s0", "paybus.a.s1"])),
            Work::RollBack { redeclare: true }
        );
    }
}
