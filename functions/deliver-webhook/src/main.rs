//! The deliver-webhook function binary: a local consumer, or a Lambda when
//! `AWS_LAMBDA_RUNTIME_API` is set. Its due-retries sweep runs in the sweeper
//! (`paybus_deliver_webhook::jobs`).

use std::process::ExitCode;

use anyhow::Context as _;
use paybus_deliver_webhook::{DeliverWebhook, WebhookConfig};

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let config = match WebhookConfig::from_env() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}");
            return Ok(ExitCode::from(2));
        }
    };
    let handler = DeliverWebhook::new(config).context("while building the HTTP client")?;
    paybus_platform::bus::function::run(move |_services| handler).await?;
    Ok(ExitCode::SUCCESS)
}
