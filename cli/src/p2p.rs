//! `paybus p2p` and `paybus reconcile quotes`: W1's ops commands.
//!
//! - `paybus p2p recheck <id>`: an IN_DOUBT deposit order (createTrade's outcome stayed
//!   unknown after every check) back to PENDING, due now, so match-deposit asks the quote
//!   service once more under the same key: the trade is settled if it exists, the liquidity
//!   released if the service says it does not (`POST
//!   /v1/admin/p2p/deposit-orders/{id}/recheck`, as the signed-in person). Exit 1 when the
//!   order is not IN_DOUBT.
//! - `paybus reconcile quotes [--since 24h]`: the quote service's trades against paybus's
//!   settled fills (orphan trades, missing trades, mismatches) and the fills in doubt; exit 1
//!   on any discrepancy.

use std::{process::ExitCode, time::Duration};

use anyhow::Context;
use paybus_config::Settings;
use paybus_db as db;
use paybus_p2p::{MatchingConfig, quote::QuoteClient, reconcile};

use crate::api_client::{ApiArgs, ApiClient};

#[derive(Debug, clap::Subcommand)]
pub enum P2pCommand {
    /// Ask the quote service again about an IN_DOUBT order's fill (same key): PENDING, due now.
    Recheck {
        id: u64,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ReconcileCommand {
    /// The quote service's trades against paybus's settled fills (W1), both ways.
    Quotes {
        /// How far back, e.g. `30m`, `24h`, `7d`.
        #[arg(long, default_value = "24h", value_parser = crate::parse_ttl)]
        since: Duration,
    },
}

pub async fn run(command: P2pCommand) -> anyhow::Result<ExitCode> {
    let P2pCommand::Recheck { id, api } = command;
    let client = ApiClient::connect(&api).await?;
    client
        .post(&format!("/v1/admin/p2p/deposit-orders/{id}/recheck"), None)
        .await?;
    println!(
        "deposit order {id}: PENDING, due now; match-deposit asks the quote service again under \
         the same key"
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn reconcile(settings: &Settings, command: ReconcileCommand) -> anyhow::Result<ExitCode> {
    let ReconcileCommand::Quotes { since } = command;
    let config = MatchingConfig::from_env()?;
    let Some(client) = QuoteClient::new(&config.quote)? else {
        anyhow::bail!("PAYBUS_QUOTE_URL is not set: no quote service to reconcile with");
    };
    let pool = db::connect(&settings.database).await?;
    let mut tx = pool.begin().await?;
    let (from, now) = crate::looking_back(&mut tx, since).await?;
    let found = reconcile::reconcile(&mut tx, &client, from, now)
        .await
        .context("while reconciling with the quote service")?;
    tx.rollback().await?;
    let at =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    println!(
        "quote service trades created {} .. {}: {} listed; fills settled since {}: {}",
        at(found.since),
        at(found.judged_until),
        found.trades_listed,
        at(found.since),
        found.fills_settled
    );
    for doubt in &found.in_doubt {
        println!(
            "in doubt: fill {} of deposit order {} ({}), {} sent {}, {} unknown outcome(s); \
             the quote service {}",
            doubt.trade_key,
            doubt.deposit_order_id,
            doubt.order_status,
            doubt.amount,
            at(doubt.sent_at),
            doubt.checks,
            doubt.service_trade_id.as_ref().map_or_else(
                || "has no trade under this key".to_owned(),
                |t| format!("has trade {t}")
            )
        );
    }
    for discrepancy in &found.discrepancies {
        println!("{discrepancy}");
    }
    if found.is_clean() {
        println!(
            "reconcile: clean (every trade settled once, every settled fill traded; {} in doubt)",
            found.in_doubt.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("reconcile: {} discrepancy(ies)", found.discrepancies.len());
        Ok(ExitCode::FAILURE)
    }
}
