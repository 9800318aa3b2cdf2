//! `paybus doctor`: is everything this process needs reachable and ready?
//!
//! One line per check, `ok` or the reason; a non-zero exit when any check fails, so scripts
//! (and `infra/run.sh`) can stop before starting functions against a dead dependency. A broker
//! that answers but blocks publishers (a resource alarm: memory or disk) fails too: every
//! process's messages would wait in the outbox.

use std::{process::ExitCode, time::Duration};

use paybus_bus::broker;
use paybus_config::{Settings, redact};
use paybus_db as db;
use paybus_telemetry as telemetry;

/// A dependency that does not answer within this is reported as down.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(settings: &Settings) -> anyhow::Result<ExitCode> {
    let checks = [
        ("database", check_database(settings).await),
        ("broker", check_broker(settings).await),
    ];
    let mut healthy = true;
    for (name, result) in checks {
        match result {
            Ok(detail) => println!("{name}: ok ({detail})"),
            Err(reason) => {
                healthy = false;
                eprintln!("{name}: FAILED: {reason}");
            }
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn check_database(settings: &Settings) -> Result<String, String> {
    let url = redact::url(&settings.database.url);
    let mut conn = tokio::time::timeout(CHECK_TIMEOUT, db::connect_once(&settings.database))
        .await
        .map_err(|_| format!("no answer from {url} within {CHECK_TIMEOUT:?}"))?
        .map_err(|e| telemetry::one_line(&e))?;
    let version = db::server_version(&mut conn)
        .await
        .map_err(|e| format!("{url}: {}", telemetry::one_line(&e)))?;
    let pending = db::pending_migrations(&mut conn)
        .await
        .map_err(|e| format!("{url}: {}", telemetry::one_line(&e)))?;
    if pending > 0 {
        return Err(format!(
            "{url} answers ({version}) but {pending} migration(s) are pending: run `paybus migrate`"
        ));
    }
    Ok(format!("{version} at {url}, migrations up to date"))
}

async fn check_broker(settings: &Settings) -> Result<String, String> {
    let url = settings.broker.redacted();
    let publishing = tokio::time::timeout(CHECK_TIMEOUT, broker::probe(&settings.broker))
        .await
        .map_err(|_| format!("no answer from {url} within {CHECK_TIMEOUT:?}"))?
        .map_err(|e| telemetry::one_line(&e))?;
    match publishing {
        broker::Publishing::Open => Ok(format!("at {url}")),
        broker::Publishing::Blocked { reason, node } => Err(format!(
            "{node} blocks publishers: {reason} (a resource alarm: free memory or disk on the \
             broker; `rabbitmq-diagnostics alarms` names the node)"
        )),
    }
}
