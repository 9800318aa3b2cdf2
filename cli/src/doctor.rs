//! `paybus doctor`: is everything this process needs reachable and ready?
//!
//! One line per check, `ok` or the reason; a non-zero exit when any check fails, so scripts
//! (and `infra/run.sh`) can stop before starting functions against a dead dependency.

use std::{process::ExitCode, time::Duration};

use paybus_platform::{Settings, broker, db, redact};

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

/// The whole error chain on one line: operators grep logs, and a wrapped error whose cause
/// sits on a second line is the one nobody reads.
fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace('\n', " ")
}

async fn check_database(settings: &Settings) -> Result<String, String> {
    let url = redact::url(&settings.database.url);
    let mut conn = tokio::time::timeout(CHECK_TIMEOUT, db::connect_once(&settings.database))
        .await
        .map_err(|_| format!("no answer from {url} within {CHECK_TIMEOUT:?}"))?
        .map_err(|e| one_line(&e))?;
    let version = db::server_version(&mut conn)
        .await
        .map_err(|e| format!("{url}: {}", one_line(&e)))?;
    let pending = db::pending_migrations(&mut conn)
        .await
        .map_err(|e| format!("{url}: {}", one_line(&e)))?;
    if pending > 0 {
        return Err(format!(
            "{url} answers ({version}) but {pending} migration(s) are pending: run `paybus migrate`"
        ));
    }
    Ok(format!("{version} at {url}, migrations up to date"))
}

async fn check_broker(settings: &Settings) -> Result<String, String> {
    let url = redact::url(&settings.broker.url);
    tokio::time::timeout(CHECK_TIMEOUT, broker::probe(&settings.broker))
        .await
        .map_err(|_| format!("no answer from {url} within {CHECK_TIMEOUT:?}"))?
        .map_err(|e| one_line(&e))?;
    Ok(format!("at {url}"))
}
