//! Every function this build of paybus runs: the one list `paybus run` and `paybus topology`
//! read, so the queues declared and the consumers started cannot drift apart.

use anyhow::Context;
use paybus_deliver_webhook::{DeliverWebhook, WebhookConfig};
use paybus_platform::bus::{Handler, Runner, topology::FunctionQueue};

pub fn queues() -> Vec<FunctionQueue> {
    vec![
        paybus_canary::Canary::queue(),
        paybus_confirm_withdrawal::ConfirmWithdrawal::queue(),
        paybus_confirm_deposit::ConfirmDeposit::queue(),
        DeliverWebhook::queue(),
    ]
}

/// Reads the functions' own settings (a bad one is a `ConfigError` naming the variable).
pub fn register(runner: &mut Runner) -> anyhow::Result<()> {
    let webhooks = DeliverWebhook::new(WebhookConfig::from_env()?)
        .context("while building the webhook HTTP client")?;
    runner.add_function(paybus_canary::Canary);
    runner.add_function(paybus_confirm_withdrawal::ConfirmWithdrawal);
    runner.add_function(paybus_confirm_deposit::ConfirmDeposit);
    runner.add_function(webhooks);
    for job in paybus_sweeper::jobs(runner.services()) {
        runner.add_job(job);
    }
    Ok(())
}
