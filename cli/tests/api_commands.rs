//! The command line's changing commands as calls to a real `paybus serve`, made as the person
//! whose token it holds: a function paused and resumed, an order in doubt rechecked, each in
//! the ops log under that person; the API's refusals shown with their status (exit 1); a
//! missing or bad token and an API that is not there said plainly.

use crate::api_process;

use std::process::Command;

use api_process::ApiProcess;
use paybus_testkit::{TestEnv, free_port};

fn run(command: &mut Command, args: &[&str]) -> (Option<i32>, String, String) {
    let output = command.args(args).output().expect("run paybus");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn ops_log(env: &TestEnv) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT actor, action, subject FROM ops_log ORDER BY seq")
        .fetch_all(&env.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn functions_pause_and_resume_are_the_apis_under_the_tokens_person() {
    let env = TestEnv::new().await;
    let Some(api) = ApiProcess::with_provider(&env, &[]).await else {
        return;
    };
    let dana = |args: &[&str]| run(&mut api.cli_as(&env, "dana"), args);

    let (paused, said, _) = dana(&[
        "functions",
        "pause",
        "confirm-withdrawal",
        "--reason",
        "partner outage",
    ]);
    let (twice, said_twice, _) =
        dana(&["functions", "pause", "confirm-withdrawal", "--reason", "x"]);
    let (_, listed, _) = run(&mut api.cli(&env), &["functions", "list"]);
    let (resumed, said_resumed, _) = dana(&["functions", "resume", "confirm-withdrawal"]);
    let (again, said_again, _) = dana(&["functions", "resume", "confirm-withdrawal"]);
    let (unknown, _, refused) = dana(&["functions", "pause", "no-such-function", "--reason", "x"]);
    let (no_reason, _, why) = dana(&["functions", "pause", "grant-bonus", "--reason", " "]);

    assert_eq!(paused, Some(0), "{said}");
    assert!(said.starts_with("confirm-withdrawal paused"), "{said}");
    assert_eq!(twice, Some(0));
    assert!(said_twice.contains("was paused already"), "{said_twice}");
    let line = listed
        .lines()
        .find(|line| line.starts_with("confirm-withdrawal"))
        .unwrap();
    assert!(
        line.contains("PAUSED since") && line.contains("dana") && line.contains("partner outage"),
        "{listed}"
    );
    assert_eq!(resumed, Some(0));
    assert!(said_resumed.contains("resumed"), "{said_resumed}");
    assert_eq!(again, Some(0));
    assert!(said_again.contains("was not paused"), "{said_again}");
    assert_eq!(unknown, Some(1));
    assert!(
        refused.contains("no function \"no-such-function\" in the catalog")
            && refused.contains("404 Not Found"),
        "{refused}"
    );
    assert_eq!(no_reason, Some(1));
    assert!(why.contains("400 Bad Request"), "{why}");
    let logged = ops_log(&env).await;
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert_eq!(
        (logged[0].0.as_str(), logged[0].1.as_str()),
        ("dana@example.com", "function.pause")
    );
    assert_eq!(
        (logged[1].0.as_str(), logged[1].1.as_str()),
        ("dana@example.com", "function.resume")
    );
}

#[tokio::test]
async fn p2p_recheck_re_arms_an_order_in_doubt_once_and_refuses_the_rest() {
    let env = TestEnv::new().await;
    // An order whose fill's outcome stayed unknown after every check, as match-deposit leaves
    // it (its path through the quote service has its own tests in paybus-api).
    let partner = sqlx::query("INSERT INTO partners (name) VALUES ('acme')")
        .execute(&env.db)
        .await
        .unwrap()
        .last_insert_id();
    let order = sqlx::query(
        "INSERT INTO p2p_deposit_orders (partner_id, currency, amount, remaining_amount, status, \
         expires_at) VALUES (?, 'USDT', 40, 40, 'IN_DOUBT', NOW(6) + INTERVAL 1 DAY)",
    )
    .bind(partner)
    .execute(&env.db)
    .await
    .unwrap()
    .last_insert_id();
    let api = ApiProcess::start(&env).await;
    let dana = |args: &[&str]| run(&mut api.cli_as(&env, "dana"), args);

    let (rechecked, said, _) = dana(&["p2p", "recheck", &order.to_string()]);
    let (again, _, refused) = dana(&["p2p", "recheck", &order.to_string()]);
    let (missing, _, not_found) = dana(&["p2p", "recheck", "987654"]);

    assert_eq!(rechecked, Some(0), "{said}");
    assert!(said.contains("PENDING, due now"), "{said}");
    let status: String = sqlx::query_scalar("SELECT status FROM p2p_deposit_orders WHERE id = ?")
        .bind(order)
        .fetch_one(&env.db)
        .await
        .unwrap();
    assert_eq!(status, "PENDING");
    assert_eq!(again, Some(1));
    assert!(
        refused.contains("is PENDING, not IN_DOUBT") && refused.contains("409 Conflict"),
        "{refused}"
    );
    assert_eq!(missing, Some(1));
    assert!(not_found.contains("404 Not Found"), "{not_found}");
    let logged = ops_log(&env).await;
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].0.contains("dana"), "{logged:?}");
    assert_eq!(
        (logged[0].1.as_str(), logged[0].2.as_str()),
        (
            "p2p_deposit_order.recheck",
            format!("p2p_deposit_order:{order}").as_str()
        )
    );
}

#[tokio::test]
async fn no_token_a_bad_token_an_ops_token_and_no_api_are_each_said_plainly() {
    let env = TestEnv::new().await;
    let api = ApiProcess::start(&env).await;
    let pause = ["functions", "pause", "grant-bonus", "--reason", "x"];

    let (unsigned, _, not_signed_in) = run(&mut api.cli(&env), &pause);
    let (bad, _, bad_token) = run(api.cli(&env).env("PAYBUS_TOKEN", "not-a-token"), &pause);
    let (ops, _, forbidden) = run(
        api.cli(&env)
            .env("PAYBUS_TOKEN", api.token_of("olga", &["OPS"])),
        &pause,
    );
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let (unreachable, _, refused) = run(
        api.cli_as(&env, "dana").env("PAYBUS_API_URL", &nowhere),
        &pause,
    );

    assert_eq!(unsigned, Some(1));
    assert!(
        not_signed_in.contains("not signed in: run `paybus login --api http://127.0.0.1:"),
        "{not_signed_in}"
    );
    assert_eq!(bad, Some(1));
    assert!(
        bad_token.contains("401 Unauthorized") && bad_token.contains("run `paybus login`"),
        "{bad_token}"
    );
    assert_eq!(ops, Some(1));
    assert!(
        forbidden.contains("needs the ADMIN role") && forbidden.contains("403 Forbidden"),
        "{forbidden}"
    );
    assert_eq!(unreachable, Some(1));
    assert!(
        refused.contains(&format!("cannot connect to the admin API at {nowhere}")),
        "{refused}"
    );
    assert!(ops_log(&env).await.is_empty(), "nothing was done");
}
