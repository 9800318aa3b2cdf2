//! The canary function binary: a local consumer, or a Lambda when `AWS_LAMBDA_RUNTIME_API` is set.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    paybus_platform::bus::function::run(|_services| paybus_canary::Canary).await?;
    Ok(())
}
