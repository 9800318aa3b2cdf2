//! `paybus dead-letters` operations as real processes, the command line calling a real `paybus
//! serve` as people: one killed mid-operation is resumed by `execute` and every letter is acted
//! on once; under four-eyes the command line stops at the operation, the requester's own
//! approval is refused (403), and someone else's lets it run.

use crate::api_process;

use std::{
    process::{Command, Output, Stdio},
    time::Duration,
};

use api_process::ApiProcess;
use paybus_bus::{Envelope, OutgoingMessage, dead_letter::record_given_up};
use paybus_testkit::{TestEnv, eventually};
use sqlx::MySqlPool;

fn run(command: &mut Command) -> Output {
    command.output().expect("run paybus")
}

/// `count` BROADCASTING withdrawals, each with a dead-lettered confirmation (safe to replay).
async fn safe_letters(pool: &MySqlPool, count: u64) {
    let partner = sqlx::query("INSERT INTO partners (name, webhook_url) VALUES ('acme', NULL)")
        .execute(pool)
        .await
        .unwrap()
        .last_insert_id();
    let mut conn = pool.acquire().await.unwrap();
    for n in 0..count {
        let withdrawal = sqlx::query(
            "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, \
             tx_hash) VALUES (?, 'NORMAL', 'BROADCASTING', 'USDT', 10, 'T-address', '0xabc')",
        )
        .bind(partner)
        .execute(pool)
        .await
        .unwrap()
        .last_insert_id();
        let envelope = Envelope::new(paybus_confirmations::WithdrawalTxConfirmed {
            withdrawal_id: withdrawal,
            tx_hash: "0xabc".to_owned(),
        });
        let message: OutgoingMessage = envelope.to_outgoing().unwrap();
        record_given_up(
            &mut conn,
            "confirm-withdrawal",
            &format!("letter-{n}"),
            &message,
            "boom",
            4,
        )
        .await
        .unwrap();
    }
}

async fn scalar(pool: &MySqlPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

const SENT: &str =
    "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'";
const GROUP: [&str; 4] = ["--function", "confirm-withdrawal", "--reason", "failed"];

#[tokio::test]
async fn an_operation_killed_mid_way_is_resumed_by_execute_and_acts_on_each_letter_once() {
    let env = TestEnv::new().await;
    let _services = env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    safe_letters(&env.db, 6).await;
    let Some(api) = ApiProcess::with_provider(&env, &[("PAYBUS_FOUR_EYES", Some("off"))]).await
    else {
        return;
    };

    // Two letters a second, two a call: the kill lands between letters.
    let mut replaying = api
        .cli_as(&env, "alice")
        .args(["dead-letters", "replay", "--yes", "--per-second", "2"])
        .args(GROUP)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(60), || async {
        scalar(
            &env.db,
            "SELECT CAST(COALESCE(MAX(done), 0) AS SIGNED) FROM dead_letter_operations",
        )
        .await
            >= 1
    })
    .await;
    replaying.kill().unwrap();
    replaying.wait().unwrap();
    assert!(started, "the replay acted on a first letter");
    let done_at_kill = scalar(
        &env.db,
        "SELECT CAST(done AS SIGNED) FROM dead_letter_operations",
    )
    .await;
    assert!(
        (1..6).contains(&done_at_kill),
        "killed mid-way, not after the end: {done_at_kill} of 6"
    );
    let id: String = sqlx::query_scalar("SELECT id FROM dead_letter_operations")
        .fetch_one(&env.db)
        .await
        .unwrap();

    let resumed = run(api.cli_as(&env, "alice").args([
        "dead-letters",
        "execute",
        &id,
        "--per-second",
        "100",
    ]));
    assert!(resumed.status.success(), "{resumed:?}");
    let again = run(api
        .cli_as(&env, "alice")
        .args(["dead-letters", "execute", &id]));
    assert!(again.status.success(), "{again:?}");

    assert_eq!(scalar(&env.db, SENT).await, 6, "each letter re-sent once");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM dead_letter_actions WHERE result = 'REPLAYED'"
        )
        .await,
        6
    );
    let (status, done): (String, u32) =
        sqlx::query_as("SELECT status, done FROM dead_letter_operations")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!((status.as_str(), done), ("DONE", 6));
}

#[tokio::test]
async fn under_four_eyes_the_cli_stops_at_the_operation_until_someone_else_approves_it() {
    let env = TestEnv::new().await;
    let _services = env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    safe_letters(&env.db, 2).await;
    // Four-eyes as deployed: the API's default guards replays.
    let Some(api) = ApiProcess::with_provider(&env, &[("PAYBUS_FOUR_EYES", None)]).await else {
        return;
    };

    let requested = run(api
        .cli_as(&env, "alice")
        .args(["dead-letters", "replay", "--yes"])
        .args(GROUP));
    let stdout = String::from_utf8_lossy(&requested.stdout);
    assert!(requested.status.success(), "{requested:?}");
    assert!(
        stdout.contains("awaits a second person's approval"),
        "{stdout}"
    );
    assert_eq!(
        scalar(&env.db, SENT).await,
        0,
        "nothing sent before the approval"
    );
    let (id, hash, requested_by): (String, String, String) =
        sqlx::query_as("SELECT id, content_hash, requested_by FROM dead_letter_operations")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(
        requested_by, "alice@example.com",
        "the provider's person, not a flag"
    );
    assert!(
        stdout.contains(&format!("paybus dead-letters approve {id} --hash {hash}\n")),
        "the line for someone else, with nothing to fill in: {stdout}"
    );

    let early = run(api
        .cli_as(&env, "alice")
        .args(["dead-letters", "execute", &id]));
    assert_eq!(early.status.code(), Some(1), "not approved yet: {early:?}");
    let own =
        run(api
            .cli_as(&env, "alice")
            .args(["dead-letters", "approve", &id, "--hash", &hash]));
    let refusal = String::from_utf8_lossy(&own.stderr);
    assert_eq!(own.status.code(), Some(1), "self-approval: {own:?}");
    assert!(
        refusal.contains("another ADMIN must approve it") && refusal.contains("403 Forbidden"),
        "{refusal}"
    );
    let approved =
        run(api
            .cli_as(&env, "bob")
            .args(["dead-letters", "approve", &id, "--hash", &hash]));
    assert!(approved.status.success(), "{approved:?}");
    assert!(
        String::from_utf8_lossy(&approved.stdout)
            .contains("approved by bob@example.com (requested by alice@example.com)"),
        "{approved:?}"
    );
    let executed = run(api
        .cli_as(&env, "alice")
        .args(["dead-letters", "execute", &id]));
    assert!(executed.status.success(), "{executed:?}");
    assert_eq!(scalar(&env.db, SENT).await, 2);
    let (approved_by, executed_by): (String, String) =
        sqlx::query_as("SELECT approved_by, executed_by FROM dead_letter_operations")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(
        (approved_by.as_str(), executed_by.as_str()),
        ("bob@example.com", "alice@example.com")
    );
}

#[tokio::test]
async fn an_archive_is_the_apis_and_puts_every_selected_letter_aside_as_the_person() {
    let env = TestEnv::new().await;
    let _services = env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    safe_letters(&env.db, 3).await;
    let Some(api) = ApiProcess::with_provider(&env, &[("PAYBUS_FOUR_EYES", Some("off"))]).await
    else {
        return;
    };

    let archived = run(api
        .cli_as(&env, "alice")
        .args(["dead-letters", "archive"])
        .args(GROUP));

    assert!(archived.status.success(), "{archived:?}");
    assert!(
        String::from_utf8_lossy(&archived.stdout).contains("3 letter(s) acted on"),
        "{archived:?}"
    );
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM dead_letters WHERE status = 'ARCHIVED'"
        )
        .await,
        3
    );
    assert_eq!(scalar(&env.db, SENT).await, 0, "an archive sends nothing");
    let archivers: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT actor FROM ops_log WHERE action = 'dead_letter.archive'",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(archivers, ["alice@example.com"]);
}
