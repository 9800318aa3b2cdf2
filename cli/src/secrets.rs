//! `paybus secrets`: the secrets paybus seals at rest (`paybus_config::sealed`).
//!
//! - `paybus secrets rotate-key`: after `PAYBUS_SECRETS_KEY` became a new key (the old one
//!   moved to `PAYBUS_SECRETS_OLD_KEYS`) in the API's processes, they re-seal every partner
//!   webhook secret still under an old key with the current one (`POST
//!   /v1/admin/secrets/rotate-key`, as the signed-in person); this prints the rows per key
//!   before and after. Safe to run twice or concurrently; once no row is under the old key,
//!   the old key can leave `PAYBUS_SECRETS_OLD_KEYS`.

use std::process::ExitCode;

use paybus_api::secrets::{KeyRows, Rotation};

use crate::api_client::{ApiArgs, ApiClient};

#[derive(Debug, clap::Subcommand)]
pub enum SecretsCommand {
    /// Re-seal every row under an old key (PAYBUS_SECRETS_OLD_KEYS) with PAYBUS_SECRETS_KEY,
    /// the keys of the API's processes.
    RotateKey {
        #[command(flatten)]
        api: ApiArgs,
    },
}

pub async fn run(command: SecretsCommand) -> anyhow::Result<ExitCode> {
    let SecretsCommand::RotateKey { api } = command;
    let client = ApiClient::connect(&api).await?;
    let rotation: Rotation = client
        .post("/v1/admin/secrets/rotate-key", None)
        .await?
        .parse()?;
    print_counts("before", &rotation.before);
    println!(
        "re-sealed under key {}: {} row(s) ({} re-sealed by another run first)",
        rotation.key_id, rotation.resealed, rotation.raced
    );
    print_counts("after", &rotation.after);
    Ok(ExitCode::SUCCESS)
}

fn print_counts(when: &str, counts: &[KeyRows]) {
    for KeyRows {
        key_id,
        current,
        rows,
    } in counts
    {
        let role = if *current { "current" } else { "old" };
        println!("{when}: key {key_id} ({role}): {rows} row(s)");
    }
}

/// `PAYBUS_SECRETS_KEY` and `PAYBUS_SECRETS_OLD_KEYS` of the process environment.
pub(crate) fn sealer_from_env()
-> Result<Option<paybus_config::sealed::Sealer>, paybus_config::ConfigError> {
    use paybus_config::sealed;
    let vars = paybus_config::Vars::from_env();
    sealed::Sealer::read(
        vars.secret(sealed::VAR_SECRETS_KEY, sealed::KEY_MIN_CHARS)?,
        &vars,
    )
}
