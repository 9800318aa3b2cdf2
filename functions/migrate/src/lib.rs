//! The deploy step: applies the database migrations and declares the RabbitMQ topology of
//! every catalog function, so no function consumes a queue that does not exist or runs
//! against a schema it does not know.
//!
//! In AWS it is a Lambda behind a CloudFormation custom resource (`Migration` in
//! `infra/aws/template.yaml`): `sam deploy` runs it once this function's new code is in place
//! and before any other function is created or updated (they all depend on it). Its
//! `Version` property is this Lambda's published version, which changes with the code (the
//! embedded migrations, the catalog), so every deploy that changes either runs it.
//!
//! It always answers CloudFormation: a custom resource that gets no answer holds the stack
//! for an hour. So the connections are made inside the invocation, not at start-up, and
//! every error becomes a `FAILED` answer carrying its reason. Delete does nothing (deleting
//! the stack never drops data); an Update whose `Version` is older than the one it replaces
//! is a rollback, and migrations only go forward, so it does nothing either. Invoked directly
//! with any other JSON (`aws lambda invoke`), it migrates and answers the report.
//!
//! Outside Lambda it runs once and exits, as `paybus migrate && paybus topology` do.

use std::{collections::HashMap, process::ExitCode, time::Duration};

use aws_lambda_events::event::cloudformation::{
    CloudFormationCustomResourceRequest, CloudFormationCustomResourceResponse,
    CloudFormationCustomResourceResponseStatus,
};
use lambda_runtime::{LambdaEvent, service_fn};
use paybus_platform::{
    Settings,
    bus::{Services, StartupError},
    config::LogFormat,
    db,
    function::{self, FunctionError},
    telemetry,
};
use serde::Serialize;
use serde_json::Value;

/// The custom resource's one physical id: an Update never replaces it, so CloudFormation
/// never sends a Delete for an old one.
pub const PHYSICAL_RESOURCE_ID: &str = "paybus-migration";

/// CloudFormation's limit on a whole answer is 4 KiB; the reason is most of it.
const MAX_REASON: usize = 1_000;

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Migrations known to this code (every one is applied after a run).
    pub migrations: usize,
    /// Function queues declared, each with its dead-letter queue.
    pub queues: usize,
}

/// Applies every pending migration and declares the exchanges and every catalog function's
/// queues (both idempotent).
pub async fn migrate_and_declare(settings: &Settings) -> Result<Report, StartupError> {
    let services = Services::connect(settings.clone()).await?;
    db::migrate(&services.pool).await?;
    let queues = paybus_catalog::queues();
    services.declare_topology(&queues).await?;
    let report = Report {
        migrations: db::MIGRATOR.iter().count(),
        queues: queues.len(),
    };
    tracing::info!(
        migrations = report.migrations,
        queues = report.queues,
        "migrations applied and topology declared"
    );
    Ok(report)
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

/// One invocation: a CloudFormation custom-resource request (answered at its `ResponseURL`),
/// or a direct invocation (answered with the report).
pub async fn handle(event: Value, client: &reqwest::Client) -> Result<Value, InvocationError> {
    if event.get("RequestType").is_none() {
        let settings = function::settings().await?;
        let report = migrate_and_declare(&settings)
            .await
            .map_err(FunctionError::from)?;
        return Ok(serde_json::to_value(report).unwrap_or_default());
    }
    let request: CloudFormationCustomResourceRequest =
        serde_json::from_value(event).map_err(InvocationError::BadRequest)?;
    let (response_url, response) = answer(request).await;
    let status = response.status.clone();
    let reply = client
        .put(&response_url)
        .body(serde_json::to_string(&response).unwrap_or_default())
        .send()
        .await
        .map_err(|e| InvocationError::Respond(e.to_string()))?;
    if !reply.status().is_success() {
        return Err(InvocationError::Respond(format!("HTTP {}", reply.status())));
    }
    Ok(serde_json::json!({ "status": status, "reason": response.reason }))
}

/// The answer to a custom-resource request, and where it goes.
async fn answer(
    request: CloudFormationCustomResourceRequest,
) -> (String, CloudFormationCustomResourceResponse) {
    let mut response = CloudFormationCustomResourceResponse::default();
    let (response_url, work) = match request {
        CloudFormationCustomResourceRequest::Create(create) => {
            response.stack_id = create.stack_id;
            response.request_id = create.request_id;
            response.logical_resource_id = create.logical_resource_id;
            (create.response_url, Work::Migrate)
        }
        CloudFormationCustomResourceRequest::Update(update) => {
            response.stack_id = update.stack_id;
            response.request_id = update.request_id;
            response.logical_resource_id = update.logical_resource_id;
            let work = if is_rollback(&update.resource_properties, &update.old_resource_properties)
            {
                Work::Nothing("a rollback: migrations only go forward")
            } else {
                Work::Migrate
            };
            (update.response_url, work)
        }
        CloudFormationCustomResourceRequest::Delete(delete) => {
            response.stack_id = delete.stack_id;
            response.request_id = delete.request_id;
            response.logical_resource_id = delete.logical_resource_id;
            (
                delete.response_url,
                Work::Nothing("deleting the stack never touches the database or the broker"),
            )
        }
        // A request type CloudFormation may add later: answering beats holding the stack.
        _ => (String::new(), Work::Nothing("unknown request type")),
    };
    response.physical_resource_id = PHYSICAL_RESOURCE_ID.to_owned();
    match work {
        Work::Nothing(why) => {
            tracing::info!(why, "custom resource: nothing to do");
            response.reason = Some(why.to_owned());
        }
        Work::Migrate => match migrate_for_cloudformation().await {
            Ok(report) => {
                response.data = HashMap::from([
                    ("Migrations".to_owned(), report.migrations.to_string()),
                    ("Queues".to_owned(), report.queues.to_string()),
                ]);
            }
            Err(error) => {
                let reason = telemetry::one_line(&error);
                tracing::error!(%reason, "custom resource: migration failed");
                response.status = CloudFormationCustomResourceResponseStatus::Failed;
                response.reason = Some(reason.chars().take(MAX_REASON).collect());
            }
        },
    }
    (response_url, response)
}

enum Work {
    Migrate,
    Nothing(&'static str),
}

async fn migrate_for_cloudformation() -> Result<Report, FunctionError> {
    let settings = function::settings().await?;
    Ok(migrate_and_declare(&settings).await?)
}

/// A rollback puts back the older `Version` (Lambda versions only grow).
fn is_rollback(properties: &Value, old_properties: &Value) -> bool {
    let version = |p: &Value| {
        p.get("Version")
            .and_then(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .or_else(|| v.as_u64().map(|n| n.to_string()))
            })
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((version(properties), version(old_properties)), (Some(new), Some(old)) if new < old)
}

/// The whole `main` of the `migrate` binary.
pub fn main() -> ExitCode {
    function::block_on(run())
}

async fn run() -> Result<(), FunctionError> {
    if !function::in_lambda() {
        let settings = function::settings().await?;
        let report = migrate_and_declare(&settings).await?;
        println!(
            "migrations: {} known, all applied; topology declared: {} function queue(s) with their dead-letter queues",
            report.migrations, report.queues
        );
        return Ok(());
    }
    telemetry::init(LogFormat::Json);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| FunctionError::Lambda(e.into()))?;
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

    #[test]
    fn an_older_version_is_a_rollback() {
        let v = |n: &str| serde_json::json!({ "Version": n });
        assert!(is_rollback(&v("3"), &v("4")));
        assert!(!is_rollback(&v("5"), &v("4")));
        assert!(!is_rollback(&v("4"), &v("4")));
        assert!(!is_rollback(&serde_json::json!({}), &v("4")));
    }
}
