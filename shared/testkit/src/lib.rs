//! The test kit: every test gets a fresh database (migrations applied) and its own RabbitMQ
//! vhost ([`TestEnv`]), so tests run in parallel and see nothing of each other; both are removed
//! when it is dropped (`infra/test.sh` also sweeps leftovers of crashed runs). Beside it: a fake
//! Lambda Runtime API ([`lambda`]), a TCP relay that makes outages ([`outage`]), an OTLP
//! receiver ([`otlp`]), a real OpenID provider ([`oidc`]), and each workflow's fixtures
//! ([`partners`], [`confirmations`], [`p2p`], [`bonuses`], [`markets`]).
//!
//! A dev-dependency only (the lab and the chaos binaries, which are not deployed, are the
//! exceptions): no production crate has a test feature, and no deployed binary links this
//! crate. Needs the services of `infra/local/start.sh` (or `PAYBUS_DATABASE_URL`,
//! `PAYBUS_AMQP_URL` and `PAYBUS_TEST_RABBITMQ_API` pointing elsewhere). Set `TEST_LOG=1` to
//! see logs.

pub mod bonuses;
pub mod confirmations;
pub mod lambda;
pub mod markets;
pub mod oidc;
pub mod otlp;
pub mod outage;
pub mod p2p;
pub mod partners;

use std::{collections::HashMap, future::Future, time::Duration};

use paybus_bus::{Services, topology::FunctionQueue};
use paybus_config::{LogFormat, Settings};
use paybus_db as db;
use paybus_money::Amount;
use paybus_ops::audit;
use sqlx::{Connection, Executor, MySqlConnection, mysql::MySqlPool};
use url::Url;

/// A test's amount literal: `dec("1.5")`.
pub fn dec(text: &str) -> Amount {
    match Amount::parse(text) {
        Ok(amount) => amount,
        Err(error) => panic!("not an amount literal: {error}"),
    }
}

/// The issuer of the people tests act as.
pub const TEST_ISSUER: &str = "https://identity.test";

/// A person the (test) identity provider vouches for, named `name` (also their subject): who
/// tests act as when they call the domain directly.
pub fn person(name: &str) -> paybus_ops::actor::Actor {
    paybus_ops::actor::Actor::person(TEST_ISSUER, name, name)
}

/// Polls `check` every 100 ms until it returns true or `timeout` passes; false on timeout.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check().await
}

/// A manual clock a second past the database's now (rows inserted just before are due on it):
/// a test moves it past a backoff, a lease or a cool-down instead of sleeping through it.
pub async fn manual_clock(pool: &MySqlPool) -> paybus_retry::Clock {
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT NOW(6)")
        .fetch_one(pool)
        .await
        .expect("the database's clock");
    paybus_retry::Clock::manual(now + chrono::Duration::seconds(1))
}

/// The repository's root folder (the test kit is `shared/testkit`).
pub fn repository() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The commit the checkout is at (`git rev-parse HEAD`): what a binary built from it reports
/// (`paybus_config::build::COMMIT`).
pub fn head_commit() -> String {
    let output = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repository())
        .output()
        .expect("run git");
    assert!(output.status.success(), "git rev-parse HEAD: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The services a process builds with `settings` (e.g. pointing at a private broker), with
/// the exchanges and `functions`' queues declared.
pub async fn services_on(settings: &Settings, functions: &[FunctionQueue]) -> Services {
    let services = Services::connect(settings.clone())
        .await
        .expect("connect to the test's database and broker");
    services
        .declare_topology(functions)
        .await
        .expect("declare the topology");
    services
}

/// A queue of the test's own bound to `routing_key` on `paybus.events`, to see what reached
/// the broker. Returns the channel it was declared on.
pub async fn tap(services: &Services, name: &str, routing_key: &str) -> lapin::Channel {
    use lapin::{
        options::{QueueBindOptions, QueueDeclareOptions},
        types::FieldTable,
    };
    let channel = services
        .connection()
        .create_channel()
        .await
        .expect("a channel for the tap");
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare the tap");
    channel
        .queue_bind(
            name.into(),
            paybus_bus::topology::EVENTS_EXCHANGE.into(),
            routing_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind the tap");
    channel
}

/// Messages ready in queue `name` now (a passive declare).
pub async fn queue_depth(channel: &lapin::Channel, name: &str) -> u32 {
    use lapin::{options::QueueDeclareOptions, types::FieldTable};
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("inspect the queue")
        .message_count()
}

/// Messages ready in queue `name` and its consumers, `None` when it does not exist.
pub async fn queue_state(services: &Services, name: &str) -> Option<(u32, u32)> {
    services
        .publisher()
        .link()
        .queue_depth(name)
        .await
        .expect("a channel to inspect the queue")
        .map(|depth| (depth.ready, depth.consumers))
}

/// The password of [`TestEnv::env_vars_with_database_unreachable`]'s database URL.
pub const UNREACHABLE_DATABASE_PASSWORD: &str = "hunter2";

/// One integer a query counts (`SELECT COUNT(*) ...`).
pub async fn scalar(pool: &MySqlPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// What a session reads (the `Handler_read_*` counters: index entries and rows) from the
/// moment it starts counting, less what reading the counters itself reads. A count, not a
/// time: a plan that reads a whole history shows in it on any machine.
pub struct HandlerReads {
    before: i64,
    counting_itself: i64,
    counters: &'static str,
}

impl HandlerReads {
    pub async fn start(conn: &mut MySqlConnection) -> Self {
        Self::counting(conn, READS).await
    }

    /// Also the index entries tested by a pushed-down condition and passed over
    /// (`Handler_icp_attempts`, MariaDB's): a plan that walks a whole history to keep a few
    /// entries of it reads few rows, but not few entries.
    pub async fn start_with_pushdown(conn: &mut MySqlConnection) -> Self {
        Self::counting(conn, READS_AND_PUSHDOWN).await
    }

    async fn counting(conn: &mut MySqlConnection, counters: &'static str) -> Self {
        let first = handler_reads(conn, counters).await;
        let counting_itself = handler_reads(conn, counters).await - first;
        Self {
            before: handler_reads(conn, counters).await,
            counting_itself,
            counters,
        }
    }

    /// What the session has read since [`HandlerReads::start`].
    pub async fn since(&self, conn: &mut MySqlConnection) -> i64 {
        handler_reads(conn, self.counters).await - self.before - self.counting_itself
    }
}

const READS: &str = "SHOW SESSION STATUS LIKE 'Handler_read%'";

const READS_AND_PUSHDOWN: &str = "SHOW SESSION STATUS \
     WHERE Variable_name LIKE 'Handler_read%' OR Variable_name = 'Handler_icp_attempts'";

async fn handler_reads(conn: &mut MySqlConnection, counters: &'static str) -> i64 {
    let counters: Vec<(String, String)> = sqlx::query_as(counters)
        .fetch_all(&mut *conn)
        .await
        .expect("the session's Handler counters");
    counters
        .iter()
        .map(|(name, value)| {
            value
                .parse::<i64>()
                .unwrap_or_else(|e| panic!("{name} = {value:?}: {e}"))
        })
        .sum()
}

/// Runs `checks` (a domain's `CHECKS`, or several) and fails the test on any violation.
pub async fn assert_audit_clean(pool: &MySqlPool, checks: &[&[audit::Check]]) {
    let checks: Vec<audit::Check> = checks.iter().flat_map(|c| c.iter().copied()).collect();
    let mut conn = pool.acquire().await.expect("a connection for the audit");
    let violations = audit::run(&mut conn, &checks).await.expect("run the audit");
    assert!(violations.is_empty(), "audit: {violations:#?}");
}

/// The `PAYBUS_SECRETS_KEY` of every test (a child process gets it through
/// [`TestEnv::env_vars`]; in-process code through [`sealer`]).
pub const SECRETS_KEY: &str = "7465737473206f6e6c792c206e657665722061207265616c206b657921212121";

/// The sealer of [`SECRETS_KEY`].
pub fn sealer() -> paybus_config::sealed::Sealer {
    paybus_config::sealed::Sealer::read(
        Some(paybus_config::Secret::new(SECRETS_KEY)),
        &paybus_config::Vars::default(),
    )
    .expect("the test key is valid")
    .expect("the test key is set")
}

pub const DEFAULT_RABBITMQ_API: &str = "http://127.0.0.1:15682/api";
/// Every per-test database and vhost starts with this, so leftovers are easy to sweep.
pub const TEST_NAME_PREFIX: &str = "paybus_t_";

pub struct TestEnv {
    /// Settings pointing at this test's own database and vhost.
    pub settings: Settings,
    pub db: MySqlPool,
    pub db_name: String,
    pub vhost: String,
    server_url: Url,
    rabbitmq_api: Url,
}

impl TestEnv {
    /// A fresh database with every migration applied, and a fresh vhost.
    pub async fn new() -> Self {
        let env = Self::unmigrated().await;
        paybus_runtime::migrations::apply(&env.db)
            .await
            .expect("migrations apply to a fresh database");
        env
    }

    /// A fresh, empty database (no migrations) and a fresh vhost.
    pub async fn unmigrated() -> Self {
        if std::env::var_os("TEST_LOG").is_some() {
            paybus_telemetry::init(LogFormat::Text);
        }
        let base = Settings::from_env().expect("test configuration is valid");
        let name = format!("{TEST_NAME_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let name = &name[..TEST_NAME_PREFIX.len() + 16];

        let mut server_url = base.database.url.clone();
        server_url.set_path("");
        let mut admin = MySqlConnection::connect(server_url.as_str())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach MariaDB at {} ({e}); start it with infra/local/start.sh",
                    paybus_config::redact::url(&server_url)
                )
            });
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .await
            .expect("create the test database");
        let _ = admin.close().await;

        let rabbitmq_api = Url::parse(
            &std::env::var("PAYBUS_TEST_RABBITMQ_API")
                .unwrap_or_else(|_| DEFAULT_RABBITMQ_API.to_owned()),
        )
        .expect("PAYBUS_TEST_RABBITMQ_API is a URL like http://127.0.0.1:15682/api");
        create_vhost(&rabbitmq_api, &base.broker.url, name).await;

        let mut settings = base;
        settings.database.url.set_path(&format!("/{name}"));
        settings.broker.set_vhost(name);
        let db = db::connect(&settings.database)
            .await
            .expect("connect to the test database");
        Self {
            settings,
            db,
            db_name: name.to_owned(),
            vhost: name.to_owned(),
            server_url,
            rabbitmq_api,
        }
    }

    /// The services a process builds, on this test's database and vhost, with the exchanges
    /// and `functions`' queues declared.
    pub async fn services(&self, functions: &[FunctionQueue]) -> Services {
        services_on(&self.settings, functions).await
    }

    /// [`env_vars`](Self::env_vars) with the database URL pointing at a port nothing listens
    /// on, its password [`UNREACHABLE_DATABASE_PASSWORD`] (to check it is never shown).
    pub fn env_vars_with_database_unreachable(&self) -> HashMap<String, String> {
        let mut vars = self.env_vars();
        vars.insert(
            "PAYBUS_DATABASE_URL".to_owned(),
            format!(
                "mysql://root:{UNREACHABLE_DATABASE_PASSWORD}@127.0.0.1:{}/paybus",
                free_port()
            ),
        );
        vars
    }

    /// `PAYBUS_*` variables that point a child process (the `paybus` binary, a function
    /// binary) at this test's database and vhost.
    pub fn env_vars(&self) -> HashMap<String, String> {
        HashMap::from([
            (
                "PAYBUS_DATABASE_URL".to_owned(),
                self.settings.database.url.to_string(),
            ),
            (
                "PAYBUS_AMQP_URL".to_owned(),
                self.settings.broker.to_env_value(),
            ),
            // Tests run in parallel: any API a child starts takes a free port.
            ("PAYBUS_HTTP_ADDR".to_owned(), "127.0.0.1:0".to_owned()),
            ("PAYBUS_SECRETS_KEY".to_owned(), SECRETS_KEY.to_owned()),
        ])
    }
}

impl TestEnv {
    /// Loads a RabbitMQ definitions document into this test's vhost (management API).
    pub async fn import_definitions(&self, definitions: &serde_json::Value) {
        let amqp = &self.settings.broker.url;
        let response = management_client()
            .post(api_url(&self.rabbitmq_api, &["definitions", &self.vhost]))
            .basic_auth(amqp.username(), Some(amqp.password().unwrap_or_default()))
            .json(definitions)
            .send()
            .await
            .expect("reach the management API");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "import definitions: {status} {body}");
    }
}

fn management_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("build an HTTP client")
}

fn api_url(api: &Url, segments: &[&str]) -> Url {
    let mut url = api.clone();
    url.path_segments_mut()
        .expect("the RabbitMQ API URL is hierarchical")
        .pop_if_empty()
        .extend(segments);
    url
}

async fn create_vhost(api: &Url, amqp: &Url, vhost: &str) {
    let client = management_client();
    let user = amqp.username();
    let password = amqp.password().unwrap_or_default();
    let response = client
        .put(api_url(api, &["vhosts", vhost]))
        .basic_auth(user, Some(password))
        .json(&serde_json::json!({"description": "paybus test"}))
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach the RabbitMQ management API at {api} ({e}); start it with infra/local/start.sh")
        });
    assert!(
        response.status().is_success(),
        "create vhost {vhost}: {}",
        response.status()
    );
    let response = client
        .put(api_url(api, &["permissions", vhost, user]))
        .basic_auth(user, Some(password))
        .json(&serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"}))
        .send()
        .await
        .expect("grant vhost permissions");
    assert!(
        response.status().is_success(),
        "grant permissions on {vhost}: {}",
        response.status()
    );
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let server_url = self.server_url.clone();
        let api = self.rabbitmq_api.clone();
        let amqp = self.settings.broker.url.clone();
        let name = self.db_name.clone();
        // Drop cannot await, and the test's runtime may be shutting down: clean up on a
        // runtime of our own. Failures here only leave a leftover for the sweep.
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                // The pool belongs to the test's runtime, which this thread must not touch;
                // idle connections hold no metadata lock, and the timeout bounds the wait for
                // a connection a test leaked mid-transaction.
                if let Ok(mut admin) = MySqlConnection::connect(server_url.as_str()).await {
                    let _ = admin.execute("SET SESSION lock_wait_timeout = 5").await;
                    let _ = admin
                        .execute(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS `{name}`"
                        )))
                        .await;
                }
                let _ = management_client()
                    .delete(api_url(&api, &["vhosts", &name]))
                    .basic_auth(amqp.username(), Some(amqp.password().unwrap_or_default()))
                    .send()
                    .await;
            });
        });
        let _ = cleanup.join();
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
