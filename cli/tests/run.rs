//! `paybus run` as a real process: it serves a ping end to end, and SIGTERM stops it cleanly.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::api_process;

use api_process::paybus;
use paybus_testkit::TestEnv;

/// Polls `child` until it exits or `timeout` passes, without blocking the runtime (the
/// relays of the start-up tests run on it).
async fn exited_within(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("poll child") {
            return Some(status);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// `paybus run` with `vars` on top of the test's, until it exits or `within` passes (then it
/// is killed): its exit status (`None`: it was still running), how long it ran, its log.
async fn run_until_exit(
    env: &TestEnv,
    vars: &[(&str, &str)],
    within: Duration,
) -> (Option<std::process::ExitStatus>, Duration, String) {
    let started = Instant::now();
    let mut run = paybus(env)
        .arg("run")
        .envs(vars.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start paybus run");
    let log = drain_stderr(&mut run);
    let status = exited_within(&mut run, within).await;
    let ran = started.elapsed();
    if status.is_none() {
        let _ = run.kill();
    }
    (status, ran, log.join().unwrap_or_default())
}

/// Drains a child's stderr on a thread (a pipe nobody reads blocks the child once it is full)
/// and keeps it for the failure message.
fn drain_stderr(child: &mut Child) -> std::thread::JoinHandle<String> {
    let mut stderr = child.stderr.take().expect("stderr piped");
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    })
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
    let log = drain_stderr(&mut run);

    // A ping published before `paybus run` has bound the canary queue is routed to
    // `paybus.unrouted` (the events exchange's alternate) and recorded as a dead letter, not
    // ponged: CI once lost the race that way. The claim here is about a running system, so
    // the ping waits for the canary's consumer. A liveness bound, not a speed claim: with
    // builds running beside it, the debug `paybus run` once took over 30 s to start.
    let services = paybus_testkit::services_on(&env.settings, &[]).await;
    let consuming = paybus_testkit::eventually(Duration::from_secs(90), || async {
        paybus_testkit::queue_state(&services, "paybus.canary")
            .await
            .is_some_and(|(_, consumers)| consumers >= 1)
    })
    .await;
    let ping = paybus(&env)
        .args(["ping", "--timeout", "60"])
        .output()
        .expect("run paybus ping");
    let stdout = String::from_utf8_lossy(&ping.stdout);
    let exited_early = run.try_wait().expect("poll paybus run");

    let kill = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("send SIGTERM");
    assert!(kill.success());
    let status = exited_within(&mut run, Duration::from_secs(20)).await;
    if status.is_none() {
        let _ = run.kill();
    }
    let log = log.join().unwrap_or_default();

    assert!(
        exited_early.is_none(),
        "paybus run exited before the ping ({exited_early:?}):\n{log}"
    );
    assert!(
        consuming,
        "nobody consumed paybus.canary within 90 s:\n{log}"
    );
    assert!(
        ping.status.success(),
        "{stdout}{}\npaybus run's log:\n{log}",
        String::from_utf8_lossy(&ping.stderr)
    );
    assert!(stdout.contains("pong"), "{stdout}");
    let status = status.expect("paybus run exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}:\n{log}");
    let ponged: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM canary_pings WHERE status = 'PONGED'")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(ponged, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_four_shards_consumes_every_shard_of_every_function() {
    let env = TestEnv::new().await;
    let layout: Vec<String> = paybus_catalog::FUNCTIONS
        .iter()
        .map(|f| format!("{}=4", f.name))
        .collect();
    let layout = layout.join(",");
    let mut run = paybus(&env)
        .arg("run")
        .env("PAYBUS_SHARDS", &layout)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start paybus run");
    let services = paybus_testkit::services_on(&env.settings, &[]).await;
    let consumers = |queue: String| {
        let services = services.clone();
        async move {
            paybus_testkit::queue_state(&services, &queue)
                .await
                .map(|(_, consumers)| consumers)
        }
    };
    let mut shard_queues = Vec::new();
    for function in paybus_catalog::FUNCTIONS {
        for index in 0..4 {
            shard_queues.push(paybus_bus::topology::shard_queue_name(function.name, index));
        }
    }

    let consuming = paybus_testkit::eventually(Duration::from_secs(90), || async {
        for queue in &shard_queues {
            if consumers(queue.clone()).await != Some(1) {
                return false;
            }
        }
        true
    })
    .await;
    let ping = paybus(&env)
        .args(["ping", "--timeout", "60"])
        .env("PAYBUS_SHARDS", &layout)
        .output()
        .expect("run paybus ping");
    let unsharded = consumers("paybus.canary".to_owned()).await;
    let _ = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status();
    let status = exited_within(&mut run, Duration::from_secs(20)).await;
    if status.is_none() {
        let _ = run.kill();
    }

    assert!(
        consuming,
        "one consumer on each of {} shard queues",
        shard_queues.len()
    );
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stderr)
    );
    assert_eq!(
        unsharded, None,
        "the unsharded queue is not part of the layout"
    );
    assert!(status.expect("paybus run exits after SIGTERM").success());
}

/// `paybus run` started before its database and broker listen (a compose file or an init
/// system starting everything at once) waits for both, then serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_database_and_a_broker_that_come_up_after_it() {
    use paybus_testkit::outage::Relay;
    let env = TestEnv::new().await;
    let database = Relay::to(&env.settings.database.url).await;
    let broker = Relay::to(&env.settings.broker.url).await;
    database.cut();
    broker.cut();
    let mut run = paybus(&env)
        .arg("run")
        .env(
            "PAYBUS_DATABASE_URL",
            database.url(&env.settings.database.url).as_str(),
        )
        .env(
            "PAYBUS_AMQP_URL",
            broker.url(&env.settings.broker.url).as_str(),
        )
        // The pool's own retries of a refused connect last this long: one try, not all four
        // seconds, so the process's wait is what holds it.
        .env("PAYBUS_DB_ACQUIRE_TIMEOUT_MS", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start paybus run");
    let log = drain_stderr(&mut run);

    // Longer than a first try and its 2-s pause: the process has been refused, and stays.
    let exited_while_away = exited_within(&mut run, Duration::from_secs(4)).await;
    database.restore().await;
    broker.restore().await;
    let services = paybus_testkit::services_on(&env.settings, &[]).await;
    let consuming = paybus_testkit::eventually(Duration::from_secs(90), || async {
        paybus_testkit::queue_state(&services, "paybus.canary")
            .await
            .is_some_and(|(_, consumers)| consumers >= 1)
    })
    .await;
    let ping = paybus(&env)
        .args(["ping", "--timeout", "60"])
        .output()
        .expect("run paybus ping");
    let kill = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("send SIGTERM");
    assert!(kill.success());
    let status = exited_within(&mut run, Duration::from_secs(20)).await;
    if status.is_none() {
        let _ = run.kill();
    }
    let log = log.join().unwrap_or_default();

    assert!(
        exited_while_away.is_none(),
        "paybus run exited while its services were away ({exited_while_away:?}):\n{log}"
    );
    assert!(
        log.contains("the database is not up yet; waiting for it"),
        "{log}"
    );
    assert!(
        log.contains("the broker is not up yet; waiting for it"),
        "{log}"
    );
    assert!(
        consuming,
        "nobody consumed paybus.canary within 90 s:\n{log}"
    );
    assert!(
        String::from_utf8_lossy(&ping.stdout).contains("pong"),
        "{ping:?}\npaybus run's log:\n{log}"
    );
    let status = status.expect("paybus run exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}:\n{log}");
}

/// The wait has an end, and a refusal that waiting cannot cure does not wait at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_gives_up_on_a_broker_still_away_after_the_wait_and_at_once_on_a_refused_login() {
    use paybus_testkit::outage::Relay;
    let env = TestEnv::new().await;
    let broker = Relay::to(&env.settings.broker.url).await;
    broker.cut();
    let relayed = broker.url(&env.settings.broker.url);
    let (away_status, waited, away_log) = run_until_exit(
        &env,
        &[
            ("PAYBUS_AMQP_URL", relayed.as_str()),
            ("PAYBUS_STARTUP_WAIT_SECONDS", "3"),
        ],
        Duration::from_secs(60),
    )
    .await;
    let status = away_status.expect("paybus run gives up once the wait is over");
    assert!(!status.success(), "{away_log}");
    assert!(
        waited >= Duration::from_secs(3),
        "gave up after {waited:?}:\n{away_log}"
    );
    assert!(
        away_log.contains("the broker is not up yet; waiting for it"),
        "{away_log}"
    );
    assert!(away_log.contains("cannot reach the broker"), "{away_log}");

    let mut wrong_password = env.settings.broker.url.clone();
    wrong_password
        .set_password(Some("not-the-password"))
        .unwrap();
    // The default wait is 60 s: exiting well inside it is the claim.
    let (refused_status, _, refused_log) = run_until_exit(
        &env,
        &[("PAYBUS_AMQP_URL", wrong_password.as_str())],
        Duration::from_secs(30),
    )
    .await;
    let status = refused_status.expect("a refused login exits without waiting");
    assert!(!status.success(), "{refused_log}");
    assert!(refused_log.contains("ACCESS_REFUSED"), "{refused_log}");
    assert!(!refused_log.contains("not up yet"), "{refused_log}");
    assert!(!refused_log.contains("not-the-password"), "{refused_log}");
}

/// `paybus serve` listens before its broker answers: a load balancer sees 503 with
/// `Retry-After` ("not yet"), never a refused connection ("dead"), and the same process
/// serves once the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_503_at_once_while_the_broker_is_away_and_200_once_it_is_back() {
    use paybus_testkit::{free_port, outage::Relay};
    let env = TestEnv::new().await;
    let broker = Relay::to(&env.settings.broker.url).await;
    broker.cut();
    let port = free_port();
    let health = format!("http://127.0.0.1:{port}/health");
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut serve = paybus(&env)
        .arg("serve")
        .env(
            "PAYBUS_AMQP_URL",
            broker.url(&env.settings.broker.url).as_str(),
        )
        .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start paybus serve");
    let log = drain_stderr(&mut serve);
    let first = loop {
        match client.get(&health).send().await {
            Ok(answer) => break Some(answer),
            Err(_) if started.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => break None,
        }
    };
    let answered_after = started.elapsed();
    let (status, retry_after, body) = match first {
        Some(answer) => (
            answer.status().as_u16(),
            answer
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned()),
            answer.text().await.unwrap(),
        ),
        None => (0, None, String::new()),
    };
    // Longer than a first try and its 2-s pause: still 503, still the same process.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = match client.get(&health).send().await {
        Ok(answer) => (answer.status().as_u16(), answer.text().await.unwrap()),
        Err(error) => (0, error.to_string()),
    };
    broker.restore().await;
    let back = paybus_testkit::eventually(Duration::from_secs(30), || async {
        client
            .get(&health)
            .send()
            .await
            .is_ok_and(|answer| answer.status() == 200)
    })
    .await;
    let exited = serve.try_wait().expect("poll paybus serve");
    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let stopped = exited_within(&mut serve, Duration::from_secs(20)).await;
    if stopped.is_none() {
        let _ = serve.kill();
    }
    let log = log.join().unwrap_or_default();

    assert_eq!(
        status, 503,
        "first answer {body:?} after {answered_after:?}:\n{log}"
    );
    assert!(
        answered_after < Duration::from_secs(1),
        "first answered after {answered_after:?}"
    );
    assert_eq!(retry_after.as_deref(), Some("5"));
    assert!(body.contains("paybus is starting"), "{body}");
    assert_eq!(still.0, 503, "{log}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&still.1).unwrap()["error"],
        "paybus is starting: waiting for the broker"
    );
    assert!(back, "no 200 within 30 s of the broker's return:\n{log}");
    assert!(exited.is_none(), "paybus serve exited: {exited:?}\n{log}");
    assert!(stopped.is_some_and(|s| s.success()), "{stopped:?}\n{log}");
}
