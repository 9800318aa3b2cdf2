//! `paybus secrets`: the secrets paybus seals at rest (`paybus_platform::sealed`).
//!
//! - `paybus secrets rotate-key`: after `PAYBUS_SECRETS_KEY` became a new key (the old one
//!   moved to `PAYBUS_SECRETS_OLD_KEYS`), re-seals every partner webhook secret still under an
//!   old key with the current one, and prints the rows per key before and after. Safe to run
//!   twice or concurrently (each UPDATE is conditional on the row's old key id); once no row is
//!   under the old key, the old key can leave `PAYBUS_SECRETS_OLD_KEYS`.

use std::process::ExitCode;

use anyhow::Context;
use paybus_partners::webhook_secrets;
use paybus_platform::{Settings, db, sealed::Sealer};

#[derive(Debug, clap::Subcommand)]
pub enum SecretsCommand {
    /// Re-seal every row under an old key (PAYBUS_SECRETS_OLD_KEYS) with PAYBUS_SECRETS_KEY.
    RotateKey,
}

pub async fn run(settings: &Settings, command: SecretsCommand) -> anyhow::Result<ExitCode> {
    match command {
        SecretsCommand::RotateKey => rotate_key(settings).await,
    }
}

async fn rotate_key(settings: &Settings) -> anyhow::Result<ExitCode> {
    let sealer = sealer_from_env()?
        .context("PAYBUS_SECRETS_KEY is not set: there is no current key to re-seal with")?;
    let pool = db::connect(&settings.database).await?;
    let mut conn = pool.acquire().await?;
    print_counts("before", &sealer, &mut conn).await?;
    let done = webhook_secrets::rotate_key(&mut conn, &sealer)
        .await
        .context("while re-sealing partner webhook secrets")?;
    println!(
        "re-sealed under key {}: {} row(s) ({} re-sealed by another run first)",
        sealer.current_key_id(),
        done.resealed,
        done.raced
    );
    print_counts("after", &sealer, &mut conn).await?;
    Ok(ExitCode::SUCCESS)
}

async fn print_counts(
    when: &str,
    sealer: &Sealer,
    conn: &mut sqlx::MySqlConnection,
) -> anyhow::Result<()> {
    let counts = webhook_secrets::count_by_key(conn)
        .await
        .context("while counting sealed rows per key")?;
    for (key_id, rows) in counts {
        let role = if sealer.is_current(&key_id) {
            "current"
        } else {
            "old"
        };
        println!("{when}: key {key_id} ({role}): {rows} row(s)");
    }
    Ok(())
}

/// `PAYBUS_SECRETS_KEY` and `PAYBUS_SECRETS_OLD_KEYS` of the process environment.
pub(crate) fn sealer_from_env()
-> Result<Option<paybus_platform::sealed::Sealer>, paybus_platform::ConfigError> {
    use paybus_platform::sealed;
    let vars = paybus_platform::config::Vars::from_env();
    sealed::Sealer::read(
        vars.secret(sealed::VAR_SECRETS_KEY, sealed::KEY_MIN_CHARS)?,
        &vars,
    )
}
