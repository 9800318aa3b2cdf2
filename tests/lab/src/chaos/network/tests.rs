//! The network faults against a real MariaDB (the test kit's, through the relays), with
//! real processes in real namespaces. Tests that need namespaces say why they skip where none
//! can be made (not root); the same faults are also tested without namespaces, which runs
//! everywhere.

use std::{
    os::unix::process::ExitStatusExt,
    process::Stdio,
    time::{Duration, Instant},
};

use paybus_testkit::TestEnv;
use sqlx::{Connection, MySqlConnection};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout},
};
use url::Url;

use super::{relay::ServerReply, *};

const MS: Duration = Duration::from_millis(1);

/// A network with namespaces, or `None` (after saying why) where this machine cannot make one.
async fn kernel_network(slots: usize) -> Option<Network> {
    let net = Network::start(NetworkOptions {
        slots,
        namespaces: true,
    })
    .await
    .unwrap();
    if let Support::No(why) = &net.capabilities().namespaces {
        eprintln!(
            "skipped: no network namespaces here ({why}); the relay-only tests cover the fallback"
        );
        return None;
    }
    eprintln!("{}", net.capabilities());
    Some(net)
}

/// The fallback a machine without namespaces gets: relays on 127.0.0.1 only.
async fn relay_only_network(slots: usize) -> Network {
    let net = Network::start(NetworkOptions {
        slots,
        namespaces: false,
    })
    .await
    .unwrap();
    assert!(!net.capabilities().namespaces.yes());
    net
}

/// Both kinds this machine can make: with namespaces (if it can) and without.
async fn every_network(slots: usize) -> Vec<Network> {
    let mut networks = Vec::new();
    if let Some(net) = kernel_network(slots).await {
        networks.push(net);
    }
    networks.push(relay_only_network(slots).await);
    networks
}

/// This test's database, relayed; the URL slot `slot` uses.
async fn relayed_database(net: &Network, env: &TestEnv, slot: usize) -> Url {
    let url = &env.settings.database.url;
    net.relay_url("mariadb", Peer::Database, url).await.unwrap();
    let relayed = Url::parse(&net.rewrite(Some(slot), url.as_str())).unwrap();
    assert_ne!(relayed.port(), url.port(), "the URL points at the relay");
    relayed
}

/// A stand-in broker (nothing in these tests talks AMQP): a port to relay and partition.
async fn relayed_stand_in_broker(net: &Network) -> tokio::net::TcpListener {
    let broker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    net.relay("rabbitmq", Peer::Broker, broker.local_addr().unwrap())
        .await
        .unwrap();
    broker
}

/// A `mariadb` client session in slot `slot` (its namespace, or the host without namespaces),
/// fed statements one by one: the same connection across a fault.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

#[derive(Debug, PartialEq)]
enum Answer {
    In(Duration),
    /// Not within the wait: the question is still out.
    Late,
    /// The client's connection ended (it exits on a lost connection).
    Closed,
}

impl Session {
    async fn open(net: &Network, slot: usize, url: &Url) -> Self {
        let mut command = net.command(slot, "mariadb").unwrap();
        command
            .args(["--unbuffered", "--skip-reconnect", "-N", "-B", "-uroot"])
            .arg(format!("--host={}", url.host_str().unwrap()))
            .arg(format!("--port={}", url.port().unwrap()))
            .arg(url.path().trim_start_matches('/'))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut session = Self {
            child,
            stdin,
            stdout,
        };
        assert!(
            matches!(session.ask(1, Duration::from_secs(10)).await, Answer::In(_)),
            "the session answers through the relay"
        );
        session
    }

    /// Asks `SELECT n` and waits up to `within` for its answer.
    async fn ask(&mut self, n: u32, within: Duration) -> Answer {
        self.stdin
            .write_all(format!("SELECT {n};\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        self.answer(n, within).await
    }

    /// Waits up to `within` for the answer to an `n` already asked.
    async fn answer(&mut self, n: u32, within: Duration) -> Answer {
        let asked = Instant::now();
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Err(_) => Answer::Late,
            Ok(Ok(Some(line))) => {
                assert_eq!(line.trim(), n.to_string());
                Answer::In(asked.elapsed())
            }
            Ok(_) => Answer::Closed,
        }
    }

    /// `rounds` questions one after the other: how long they took in all.
    async fn round_trips(&mut self, rounds: u32) -> Duration {
        let started = Instant::now();
        for n in 0..rounds {
            let answer = self.ask(100 + n, Duration::from_secs(60)).await;
            assert!(
                matches!(answer, Answer::In(_)),
                "round trip {n}: {answer:?}"
            );
        }
        started.elapsed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_says_which_mechanisms_this_machine_allows() {
    let net = relay_only_network(1).await;
    assert_eq!(
        net.capabilities().to_string(),
        "network faults: relays only (no namespaces: not asked for) — latency, partitions, \
         socket resets and COMMIT resets by relay; no packet loss"
    );
    let Some(net) = kernel_network(1).await else {
        return;
    };
    let capabilities = net.capabilities().clone();
    let line = capabilities.to_string();
    assert!(line.starts_with("network faults: kernel (netns"), "{line}");
    assert_eq!(
        line.contains("latency by relay: no netem"),
        !capabilities.netem.yes(),
        "{line}"
    );
    assert_eq!(line.contains(" + nft"), capabilities.nft.yes(), "{line}");
    net.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_in_its_namespace_reaches_mariadb_through_the_relay_and_nothing_else() {
    let Some(net) = kernel_network(1).await else {
        return;
    };
    let env = TestEnv::unmigrated().await;
    let url = relayed_database(&net, &env, 0).await;
    assert_eq!(
        url.host_str(),
        Some(net.plan.as_ref().unwrap().relay_ip().to_string().as_str())
    );
    let mariadb = |host: String, port: u16| {
        let mut command = net.command(0, "mariadb").unwrap();
        command
            .args([
                "-N",
                "-B",
                "-uroot",
                "--connect-timeout=3",
                "-e",
                "SELECT 40 + 2",
            ])
            .arg(format!("--host={host}"))
            .arg(format!("--port={port}"))
            .kill_on_drop(true);
        command
    };

    let through_relay = mariadb(url.host_str().unwrap().to_owned(), url.port().unwrap())
        .output()
        .await
        .unwrap();
    let direct = env.settings.database.url.clone();
    let around_relay = mariadb(
        direct.host_str().unwrap().to_owned(),
        direct.port().unwrap(),
    )
    .output()
    .await
    .unwrap();

    assert!(
        through_relay.status.success(),
        "{}",
        String::from_utf8_lossy(&through_relay.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&through_relay.stdout).trim(), "42");
    // The namespace's 127.0.0.1 is its own: the host's MariaDB is out of reach but by relay.
    assert!(!around_relay.status.success());
    net.cleanup().await.unwrap();
}

/// Waits (up to 2 s) until `pid` runs `sleep` in a network namespace other than this one's:
/// `ip netns exec` has entered it and exec'd.
async fn became_sleep_in_a_namespace(pid: u32) -> bool {
    let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
    let own_namespace = std::fs::read_link("/proc/self/ns/net").unwrap();
    for _ in 0..100 {
        let comm = std::fs::read_to_string(proc.join("comm")).unwrap_or_default();
        let namespace = std::fs::read_link(proc.join("ns/net")).ok();
        if comm.trim() == "sleep" && namespace.is_some_and(|ns| ns != own_namespace) {
            return true;
        }
        tokio::time::sleep(20 * MS).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_to_the_spawned_pid_kills_the_program_itself_in_its_namespace() {
    let Some(net) = kernel_network(1).await else {
        return;
    };
    let mut child = net
        .command(0, "sleep")
        .unwrap()
        .arg("30")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
    let own_namespace = std::fs::read_link("/proc/self/ns/net").unwrap();
    // `ip netns exec` enters the namespace and execs: the same pid becomes `sleep`.
    assert!(
        became_sleep_in_a_namespace(pid).await,
        "pid {pid} never became `sleep`"
    );
    assert_ne!(
        std::fs::read_link(proc.join("ns/net")).unwrap(),
        own_namespace
    );

    child.start_kill().unwrap();
    let status = child.wait().await.unwrap();

    assert_eq!(status.signal(), Some(9));
    net.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_from_the_database_stalls_its_queries_until_it_ends_and_spares_the_broker() {
    let env = TestEnv::unmigrated().await;
    for net in every_network(1).await {
        let url = relayed_database(&net, &env, 0).await;
        let _broker = relayed_stand_in_broker(&net).await;
        let mut session = Session::open(&net, 0, &url).await;

        let broker_cut = net.partition(0, Peer::Broker, Duration::from_secs(3)).await;
        let during_broker_cut = session.ask(2, Duration::from_secs(5)).await;
        let cut = net
            .partition(0, Peer::Database, Duration::from_secs(3))
            .await;
        let cut_at = Instant::now();
        let during_cut = session.ask(3, Duration::from_millis(1500)).await;
        let late = session.answer(3, Duration::from_secs(20)).await;
        let answered_after = cut_at.elapsed();
        let after_cut = session.ask(4, Duration::from_secs(5)).await;

        eprintln!("{cut}; late answer after {answered_after:?}");
        assert_eq!(broker_cut.applied, Applied::Yes, "{broker_cut}");
        assert!(matches!(during_broker_cut, Answer::In(_)));
        assert_eq!(cut.applied, Applied::Yes, "{cut}");
        let expected = if net.capabilities().nft.yes() {
            Mechanism::Nft
        } else {
            Mechanism::Relay
        };
        assert_eq!(cut.mechanism, expected);
        assert_eq!(during_cut, Answer::Late);
        assert!(matches!(late, Answer::In(_)), "{late:?}");
        assert!(
            answered_after >= Duration::from_millis(2900),
            "{answered_after:?}"
        );
        assert!(matches!(after_cut, Answer::In(_)), "{after_cut:?}");
        drop(session);
        net.cleanup().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_30_percent_slows_round_trips_and_drops_packets() {
    let env = TestEnv::unmigrated().await;
    let without = relay_only_network(1).await;
    let not_applied = without.loss(0, 30, Duration::from_secs(5)).await;
    assert!(
        matches!(not_applied.applied, Applied::NotAvailable(_)),
        "{not_applied}"
    );
    without.cleanup().await.unwrap();
    let Some(net) = kernel_network(1).await else {
        return;
    };
    if let Support::No(why) = &net.capabilities().nft {
        eprintln!("skipped: no nft ({why})");
        let fault = net.loss(0, 30, Duration::from_secs(5)).await;
        assert!(matches!(fault.applied, Applied::NotAvailable(_)), "{fault}");
        return;
    }
    let url = relayed_database(&net, &env, 0).await;
    let mut session = Session::open(&net, 0, &url).await;
    let clean = session.round_trips(20).await;

    let fault = net.loss(0, 30, Duration::from_secs(300)).await;
    let lossy = session.round_trips(20).await;
    let ruleset = Line::inside(&net.namespace(0).unwrap(), "nft")
        .args(["list", "ruleset"])
        .run()
        .await
        .unwrap();
    let dropped: u64 = ruleset
        .split("counter packets ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum();

    eprintln!(
        "{fault}: 20 round trips {clean:?} clean, {lossy:?} lossy, {dropped} packets dropped"
    );
    assert_eq!(fault.applied, Applied::Yes, "{fault}");
    assert!(dropped > 0);
    // Each round trip with its query or answer lost waits for a retransmission (at least
    // TCP's 200 ms minimum RTO); with 30 % each way, about half of them: fewer than two of
    // twenty has a chance of about 1 in 10^5.
    assert!(lossy >= clean + 400 * MS, "{lossy:?} vs {clean:?}");
    drop(session);
    net.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_adds_at_least_its_base_to_a_round_trip_and_ends_by_itself() {
    let env = TestEnv::unmigrated().await;
    for net in every_network(1).await {
        let url = relayed_database(&net, &env, 0).await;
        let mut session = Session::open(&net, 0, &url).await;
        let base = 200 * MS;
        let jitter = 50 * MS;

        let fault = net.latency(0, base, jitter, Duration::from_secs(3)).await;
        let slow = session.ask(2, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(3300)).await;
        let mut after = Vec::new();
        for n in 0..3 {
            after.push(session.ask(10 + n, Duration::from_secs(10)).await);
        }

        eprintln!("{fault}: a round trip took {slow:?}, then {after:?}");
        assert_eq!(fault.applied, Applied::Yes, "{fault}");
        let expected = if net.capabilities().netem.yes() {
            Mechanism::Netem
        } else {
            Mechanism::Relay
        };
        assert_eq!(fault.mechanism, expected);
        // base - jitter at least, each way.
        let Answer::In(slow) = slow else {
            panic!("{slow:?}")
        };
        assert!(slow >= 2 * (base - jitter), "{slow:?}");
        let fastest = after
            .iter()
            .filter_map(|a| match a {
                Answer::In(d) => Some(*d),
                _ => None,
            })
            .min()
            .unwrap();
        assert!(fastest < base - jitter, "{after:?}");
        drop(session);
        net.cleanup().await.unwrap();
    }
}

/// The variable that makes [`commit_client_in_a_namespace`] act (its database URL).
const COMMIT_CLIENT_URL: &str = "PAYBUS_TEST_COMMIT_CLIENT_URL";
const COMMIT_CLIENT_ID: &str = "PAYBUS_TEST_COMMIT_CLIENT_ID";

/// One sqlx transaction: insert row `id` and commit; what the client saw.
async fn insert_and_commit(url: &str, id: i32) -> String {
    let mut connection = MySqlConnection::connect(url).await.unwrap();
    let mut tx = connection.begin().await.unwrap();
    sqlx::query("INSERT INTO network_commit (id) VALUES (?)")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    match tx.commit().await {
        Ok(()) => "commit: ok".to_owned(),
        Err(e) => format!("commit: error: {e}"),
    }
}

/// Not a test of its own: the sqlx client of the COMMIT reset test, run by it inside a
/// namespace (this test binary, started again under `ip netns exec`). Does nothing without
/// its variables.
#[tokio::test]
#[ignore = "run inside a namespace by a_commit_reset_leaves_the_client_in_doubt_while_the_row_is_committed"]
async fn commit_client_in_a_namespace() {
    let (Ok(url), Ok(id)) = (
        std::env::var(COMMIT_CLIENT_URL),
        std::env::var(COMMIT_CLIENT_ID),
    ) else {
        return;
    };
    println!("{}", insert_and_commit(&url, id.parse().unwrap()).await);
}

/// Inserts and commits row `id` as a process of slot 0 would: from inside its namespace, or
/// without namespaces through slot 0's relay.
async fn commit_from_slot_0(net: &Network, url: &Url, id: i32) -> String {
    if net.namespace(0).is_none() {
        return insert_and_commit(url.as_str(), id).await;
    }
    let output = net
        .command(0, std::env::current_exe().unwrap())
        .unwrap()
        .args([
            "chaos::network::tests::commit_client_in_a_namespace",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(COMMIT_CLIENT_URL, url.as_str())
        .env(COMMIT_CLIENT_ID, id.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find(|line| line.starts_with("commit: "))
        .unwrap_or_else(|| {
            panic!(
                "the client in the namespace said nothing:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_reset_leaves_the_client_in_doubt_while_the_row_is_committed() {
    let env = TestEnv::unmigrated().await;
    sqlx::query("CREATE TABLE network_commit (id INT PRIMARY KEY)")
        .execute(&env.db)
        .await
        .unwrap();
    let mut id = 0;
    for net in every_network(1).await {
        let url = relayed_database(&net, &env, 0).await;
        id += 10;

        let armed = net.reset_after_commit(0, 1).await;
        let in_doubt = commit_from_slot_0(&net, &url, id).await;
        let committed: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM network_commit WHERE id = ?")
            .bind(id)
            .fetch_one(&env.db)
            .await
            .unwrap();
        let resets = net.commit_resets();
        let next = commit_from_slot_0(&net, &url, id + 1).await;
        let next_committed: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM network_commit WHERE id = ?")
                .bind(id + 1)
                .fetch_one(&env.db)
                .await
                .unwrap();

        eprintln!("{armed}: the client saw {in_doubt:?}; the relay recorded {resets:?}");
        assert_eq!(armed.applied, Applied::Yes);
        assert!(in_doubt.starts_with("commit: error"), "{in_doubt}");
        // Read directly, not through the relay: the transaction the client could not confirm
        // did commit.
        assert_eq!(committed, 1);
        assert_eq!(resets.len(), 1);
        assert_eq!(resets[0].server, ServerReply::Ok);
        assert_eq!(resets[0].slot, Some(0));
        assert_eq!(resets[0].namespace, net.namespace(0));
        // One reset was armed, one was used: the next commit goes through.
        assert_eq!(net.commit_resets_armed(0), 0);
        assert_eq!(next, "commit: ok");
        assert_eq!(next_committed, 1);
        net.cleanup().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_slots_sockets_ends_its_database_connections_only() {
    let env = TestEnv::unmigrated().await;
    for net in every_network(2).await {
        let url_0 = relayed_database(&net, &env, 0).await;
        let url_1 = Url::parse(&net.rewrite(Some(1), env.settings.database.url.as_str())).unwrap();
        let mut session_0 = Session::open(&net, 0, &url_0).await;
        let mut session_1 = Session::open(&net, 1, &url_1).await;

        let fault = net.kill_sockets(0, Peer::Database).await;
        let killed = session_0.ask(2, Duration::from_secs(10)).await;
        let spared = session_1.ask(2, Duration::from_secs(10)).await;

        eprintln!("{fault}");
        assert_eq!(fault.applied, Applied::Yes, "{fault}");
        let expected = if net.capabilities().ss_kill.yes() {
            Mechanism::SsKill
        } else {
            Mechanism::Relay
        };
        assert_eq!(fault.mechanism, expected);
        assert!(fault.what.contains(": 1 "), "{fault}");
        assert_eq!(killed, Answer::Closed);
        assert!(matches!(spared, Answer::In(_)), "{spared:?}");
        let _ = session_0.child.wait().await;
        drop(session_1);
        net.cleanup().await.unwrap();
    }
}

/// Any network's start removes the leftovers this test plays, so the network tests run one at
/// a time (`.config/nextest.toml`, group `network-namespaces`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_everything_and_a_start_removes_what_a_killed_run_left() {
    if kernel_network(1).await.is_none() {
        return;
    }
    // A run that was SIGKILLed: its pid is gone; its namespace (with a process still in it),
    // host veth and relay address are left.
    let mut gone = tokio::process::Command::new("true").spawn().unwrap();
    let dead_pid = gone.id().unwrap();
    gone.wait().await.unwrap();
    let prefix = format!("pbc{dead_pid}a");
    let namespace = format!("{prefix}-0");
    let ip = |args: Vec<String>| Line::new("ip").args(args);
    namespaces::claim_subnet(&format!("lo:{prefix}"))
        .await
        .unwrap();
    for args in [
        vec!["netns".into(), "add".into(), namespace.clone()],
        vec![
            "link".into(),
            "add".into(),
            format!("{prefix}h0"),
            "type".into(),
            "veth".into(),
            "peer".into(),
            "name".into(),
            "veth0".into(),
            "netns".into(),
            namespace.clone(),
        ],
    ] {
        ip(args).run().await.unwrap();
    }
    let mut left_running = tokio::process::Command::new(command::find("ip").unwrap())
        .args(["netns", "exec", &namespace, "sleep", "60"])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(became_sleep_in_a_namespace(left_running.id().unwrap()).await);
    assert_eq!(namespaces::remains_of(&prefix).await.unwrap().len(), 3);

    let net = kernel_network(2).await.unwrap();
    let leftovers = namespaces::remains_of(&prefix).await.unwrap();
    let leftover_process = tokio::time::timeout(Duration::from_secs(5), left_running.wait()).await;
    let url_env = TestEnv::unmigrated().await;
    let _url = relayed_database(&net, &url_env, 1).await;
    let _table = net.loss(1, 1, Duration::from_secs(300)).await;
    let mut inside = net
        .command(1, "sleep")
        .unwrap()
        .arg("60")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    assert!(became_sleep_in_a_namespace(inside.id().unwrap()).await);
    let own_prefix = net.prefix().unwrap().to_owned();
    let before_cleanup = namespaces::remains_of(&own_prefix).await.unwrap();
    net.cleanup().await.unwrap();
    let after_cleanup = namespaces::remains_of(&own_prefix).await.unwrap();
    let inside_process = tokio::time::timeout(Duration::from_secs(5), inside.wait()).await;

    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert_eq!(leftover_process.unwrap().unwrap().signal(), Some(9));
    // Two namespaces, two veths, the relay address.
    assert_eq!(before_cleanup.len(), 5, "{before_cleanup:?}");
    assert!(after_cleanup.is_empty(), "{after_cleanup:?}");
    assert!(net.remains().await.unwrap().is_empty());
    assert_eq!(inside_process.unwrap().unwrap().signal(), Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_on_a_slot_that_does_not_exist_fails_naming_it() {
    let net = relay_only_network(1).await;
    let fault = net
        .partition(3, Peer::Database, Duration::from_secs(1))
        .await;
    assert!(fault.failed());
    assert!(fault.to_string().contains("no slot 3"), "{fault}");
    let fault = net.partition(0, Peer::Broker, Duration::from_secs(1)).await;
    assert!(
        fault.to_string().contains("no relay to the broker"),
        "{fault}"
    );
    assert!(net.command(1, "true").is_err());
    net.cleanup().await.unwrap();
}
