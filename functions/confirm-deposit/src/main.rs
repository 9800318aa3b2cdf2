//! The confirm-deposit function binary: a local consumer, or a Lambda when
//! `AWS_LAMBDA_RUNTIME_API` is set.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    paybus_platform::bus::function::run(|_services| paybus_confirm_deposit::ConfirmDeposit).await?;
    Ok(())
}
