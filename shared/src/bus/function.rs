//! The entry point of a function binary: the same handler runs as a local consumer or, when
//! `AWS_LAMBDA_RUNTIME_API` is set (Lambda sets it), under `lambda_runtime` on Amazon MQ events.

use crate::{ConfigError, Settings, telemetry};

use super::{
    handler::Handler,
    lambda,
    runner::Runner,
    services::{Services, StartupError, shutdown_on_signal},
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

/// Builds the services once, then runs `build`'s handler until SIGTERM (locally) or for the
/// life of the Lambda execution environment.
pub async fn run<H: Handler>(build: impl FnOnce(&Services) -> H) -> Result<(), FunctionError> {
    let settings = Settings::from_env()?;
    let in_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    telemetry::init(if in_lambda {
        crate::config::LogFormat::Json
    } else {
        settings.log_format
    });
    let services = Services::connect(settings).await?;
    let handler = build(&services);
    if in_lambda {
        return lambda::run(handler, services)
            .await
            .map_err(FunctionError::Lambda);
    }
    let mut runner = Runner::new(services);
    runner.add_function(handler);
    runner.run(shutdown_on_signal()).await?;
    Ok(())
}
