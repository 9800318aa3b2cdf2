//! The entry point of a function binary: the same handler runs as a local consumer or, when
//! `AWS_LAMBDA_RUNTIME_API` is set (Lambda sets it), under `lambda_runtime` on Amazon MQ events.

use std::sync::Arc;

use lambda_runtime::{LambdaEvent, service_fn};

use crate::{ConfigError, Settings, telemetry};

use super::{
    handler::Handler,
    lambda,
    runner::{Runner, outbox_relay_job},
    services::{Services, StartupError, shutdown_on_signal},
    sweeper::{self, Job},
};

#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("lambda runtime: {0}")]
    Lambda(lambda_runtime::Error),
}

fn in_lambda() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some()
}

async fn start() -> Result<Services, FunctionError> {
    let settings = Settings::from_env()?;
    telemetry::init(if in_lambda() {
        crate::config::LogFormat::Json
    } else {
        settings.log_format
    });
    Ok(Services::connect(settings).await?)
}

/// The sweeper's entry point: the outbox relay plus `build`'s maintenance jobs. In AWS it is a
/// scheduled Lambda (EventBridge) and each invocation runs every job once, failing the
/// invocation if one failed; locally each job runs on its own timer until SIGTERM.
pub async fn run_sweeper(
    build: impl FnOnce(&Services) -> Vec<Arc<dyn Job>>,
) -> Result<(), FunctionError> {
    let services = start().await?;
    let mut jobs = vec![outbox_relay_job(&services)];
    jobs.extend(build(&services));
    if !in_lambda() {
        sweeper::run(jobs, shutdown_on_signal()).await;
        return Ok(());
    }
    let jobs = &jobs;
    lambda_runtime::run(service_fn(
        move |_: LambdaEvent<serde_json::Value>| async move {
            let mut report = serde_json::Map::new();
            let mut failed = Vec::new();
            for (name, result) in sweeper::run_all_once(jobs).await {
                match result {
                    Ok(done) => {
                        report.insert(name.to_owned(), done.changed.into());
                    }
                    Err(error) => failed.push(format!("{name}: {error}")),
                }
            }
            if failed.is_empty() {
                Ok(serde_json::Value::Object(report))
            } else {
                Err(lambda_runtime::Error::from(failed.join("; ")))
            }
        },
    ))
    .await
    .map_err(FunctionError::Lambda)
}

/// Builds the services once, then runs `build`'s handler until SIGTERM (locally) or for the
/// life of the Lambda execution environment.
pub async fn run<H: Handler>(build: impl FnOnce(&Services) -> H) -> Result<(), FunctionError> {
    let services = start().await?;
    let handler = build(&services);
    if in_lambda() {
        return lambda::run(handler, services)
            .await
            .map_err(FunctionError::Lambda);
    }
    let mut runner = Runner::new(services);
    runner.add_function(handler);
    runner.run(shutdown_on_signal()).await?;
    Ok(())
}
