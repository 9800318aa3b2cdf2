//! Each workflow's demo (`infra/demo/<workflow>.sh`, linked from the README as a newcomer's
//! first hour) run once against this build's `paybus`, on a database and vhost of its own:
//! the script exits 0, prints what its workflow promises and ends with a clean audit.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
};

use paybus_testkit::TestEnv;

const BROKEN_CONFIRM_WITHDRAWAL: &str = env!("CARGO_BIN_EXE_confirm-withdrawal-read-then-update");

/// The `paybus` binary of this build (next to every function binary).
fn paybus() -> PathBuf {
    let paybus = Path::new(BROKEN_CONFIRM_WITHDRAWAL).with_file_name("paybus");
    assert!(
        paybus.is_file(),
        "{} is missing: build the workspace's binaries first (cargo build --workspace --bins)",
        paybus.display()
    );
    paybus
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `infra/demo/<workflow>.sh`; its output, after asserting it succeeded.
async fn demo(workflow: &str) -> String {
    let env = TestEnv::new().await;
    let vars = env.env_vars();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infra/demo")
        .join(format!("{workflow}.sh"));
    let (http, partner, quotes) = (free_port(), free_port(), free_port());
    let output = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(script)
            .env("PAYBUS_BIN", paybus())
            .env("PAYBUS_DEMO_DATABASE_URL", &vars["PAYBUS_DATABASE_URL"])
            .env("PAYBUS_DEMO_AMQP_URL", &vars["PAYBUS_AMQP_URL"])
            .env("PAYBUS_DEMO_HTTP_PORT", http.to_string())
            .env("PAYBUS_DEMO_PARTNER_PORT", partner.to_string())
            .env("PAYBUS_DEMO_QUOTE_PORT", quotes.to_string())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{workflow}.sh failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("audit: clean"),
        "{workflow}.sh did not end with a clean audit:\n{stdout}"
    );
    drop(env);
    stdout
}

#[tokio::test]
async fn the_confirmations_demo_debits_each_withdrawal_once() {
    let out = demo("confirmations").await;
    for id in 1..=3 {
        assert!(
            out.contains(&format!("withdrawal {id}: 1 DEBIT, key WDR_CONFIRM:{id}")),
            "{out}"
        );
    }
    assert_eq!(out.matches("WITHDRAWAL_CONFIRMED {").count(), 3, "{out}");
}

#[tokio::test]
async fn the_p2p_demo_settles_the_trade_made_while_its_answer_was_late() {
    let out = demo("p2p").await;
    assert!(out.contains("order 2: PENDING"), "{out}");
    assert!(
        out.contains("trade in doubt under key p2p-deposit-2-fill-1"),
        "{out}"
    );
    assert!(out.contains("order 3: CANCELLED NO_LIQUIDITY"), "{out}");
    assert!(out.contains("order 2: MATCHED FILLED"), "{out}");
    assert!(
        out.contains("order 2: CONFIRMED 60.00 USDT, key p2p-deposit-2-fill-1, trade t-2"),
        "{out}"
    );
    assert!(out.contains("reconcile: clean"), "{out}");
}

#[tokio::test]
async fn the_bonuses_demo_grants_one_bonus_for_four_completions() {
    let out = demo("bonuses").await;
    assert!(out.contains("'aos_can': 450"), "{out}");
    assert!(out.contains("EVENT 150 cans, COMPLETE"), "{out}");
    assert_eq!(
        out.matches("ACTIVE_CHARGE_EVENT 150 cans, DONE").count(),
        1,
        "{out}"
    );
}

#[tokio::test]
async fn the_markets_demo_cancels_every_open_order_of_the_suspended_market() {
    let out = demo("markets").await;
    assert!(out.contains("suspension complete (499 / 499"), "{out}");
    assert!(out.contains("CANCELLED: 499"), "{out}");
    assert!(out.contains("DONE: 499"), "{out}");
}
