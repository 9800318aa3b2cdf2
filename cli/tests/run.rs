//! `paybus run` as a real process: it serves a ping end to end, and SIGTERM stops it cleanly.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use paybus_platform::testing::TestEnv;

fn paybus(env: &TestEnv) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_paybus"));
    command.envs(env.env_vars());
    command
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("poll child") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[tokio::test]
async fn run_serves_a_ping_and_stops_cleanly_on_sigterm() {
    let env = TestEnv::new().await;
    let mut run = paybus(&env)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start paybus run");

    // A liveness bound, not a speed claim: with builds running beside it, the debug `paybus
    // run` once took over 30 s to start consuming.
    let ping = paybus(&env)
        .args(["ping", "--timeout", "90"])
        .output()
        .expect("run paybus ping");
    let stdout = String::from_utf8_lossy(&ping.stdout);

    let kill = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("send SIGTERM");
    assert!(kill.success());
    let status = wait_exit(&mut run, Duration::from_secs(20));
    if status.is_none() {
        let _ = run.kill();
    }

    assert!(
        ping.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&ping.stderr)
    );
    assert!(stdout.contains("pong"), "{stdout}");
    let status = status.expect("paybus run exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    let ponged: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(ponged, 1);
}
