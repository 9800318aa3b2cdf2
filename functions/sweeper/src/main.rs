//! The sweeper binary: a scheduled Lambda (EventBridge) in AWS, timers locally.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    paybus_platform::bus::function::run_sweeper(paybus_sweeper::jobs).await?;
    Ok(())
}
