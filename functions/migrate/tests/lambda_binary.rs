//! The real `migrate` binary behind a CloudFormation custom resource: CloudFormation's request
//! arrives as the Lambda event (as CloudFormation sends it: every property a string, `Version`
//! the ARN `Ref: MigrateFunction.Version` gives), the answer goes to its `ResponseURL` (a local
//! server here) with the documented response body, and whatever happens, CloudFormation gets
//! an answer.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::put};
use paybus_bus::Envelope;
use paybus_config::Shards;
use paybus_db::MIGRATOR;
use paybus_testkit::{
    TestEnv,
    lambda::{LambdaProcess, RuntimeApi, SecretsExtension},
    queue_depth, scalar, services_on,
};
use serde_json::{Value, json};
use sqlx::MySqlPool;
use tokio::sync::mpsc;

const FUNCTION_ARN: &str =
    "arn:aws:lambda:eu-central-1:123456789012:function:paybus-MigrateFunction-7QRkXq3vQ1Zs";

/// What `Ref: MigrateFunction.Version` is in a request: the published version's ARN.
fn version(n: u32) -> String {
    format!("{FUNCTION_ARN}:{n}")
}

/// Where CloudFormation would wait for the answer (a presigned S3 URL in AWS).
struct ResponseUrl {
    url: String,
    answers: mpsc::UnboundedReceiver<Value>,
}

impl ResponseUrl {
    async fn start() -> Self {
        let (tx, answers) = mpsc::unbounded_channel();
        let app = Router::new()
            .route(
                "/cfn-response",
                put(
                    |State(tx): State<Arc<mpsc::UnboundedSender<Value>>>, body: Bytes| async move {
                        let _ = tx.send(serde_json::from_slice(&body).unwrap_or(Value::Null));
                        StatusCode::OK
                    },
                ),
            )
            .with_state(Arc::new(tx));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/cfn-response?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, answers }
    }

    /// A request as CloudFormation sends it for the `Migration` resource of the template, the
    /// catalog's unsharded queues as `Queues`. `old_version` makes it an Update
    /// (`OldResourceProperties`, the same queues).
    fn request(&self, request_type: &str, version: &str, old_version: Option<&str>) -> String {
        let queues = unsharded_queues();
        self.request_with(
            request_type,
            version,
            &queues,
            old_version.map(|old| (old, queues.as_slice())),
        )
    }

    /// The same with the `Queues` given, and the old ones of an Update.
    fn request_with(
        &self,
        request_type: &str,
        version: &str,
        queues: &[String],
        old: Option<(&str, &[String])>,
    ) -> String {
        let properties = |version: &str, queues: &[String]| {
            json!({
                "ServiceToken": FUNCTION_ARN,
                "ServiceTimeout": "660",
                "Version": version,
                "Queues": queues,
            })
        };
        let mut request = json!({
            "RequestType": request_type,
            "ServiceToken": FUNCTION_ARN,
            "ResponseURL": self.url,
            "StackId": "arn:aws:cloudformation:eu-central-1:123456789012:stack/paybus/5b3bd4e0-9ac1-11ef-8f2e-0a1f2b3c4d5e",
            "RequestId": format!("{request_type}-{}", version.rsplit(':').next().unwrap()),
            "ResourceType": "Custom::PaybusMigration",
            "LogicalResourceId": "Migration",
            "ResourceProperties": properties(version, queues),
        });
        if request_type != "Create" {
            request["PhysicalResourceId"] = json!("paybus-migration");
        }
        if let Some((old_version, old_queues)) = old {
            request["OldResourceProperties"] = properties(old_version, old_queues);
        }
        request.to_string()
    }

    async fn answer(&mut self) -> Value {
        let answer = tokio::time::timeout(std::time::Duration::from_secs(30), self.answers.recv())
            .await
            .expect("CloudFormation is answered")
            .unwrap();
        assert_documented(&answer);
        answer
    }
}

fn unsharded_queues() -> Vec<String> {
    paybus_catalog::queues(&Shards::default())
        .iter()
        .map(|q| q.queue())
        .collect()
}

/// The `migrate` binary as a Lambda, and CloudFormation waiting for its answers.
struct Migrate {
    cloudformation: ResponseUrl,
    api: RuntimeApi,
    lambda: LambdaProcess,
}

impl Migrate {
    async fn start(vars: HashMap<String, String>) -> Self {
        let cloudformation = ResponseUrl::start().await;
        let api = RuntimeApi::start().await;
        let lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_migrate"), &api, vars);
        Self {
            cloudformation,
            api,
            lambda,
        }
    }

    /// Another release's code (a new process with `vars`) for the next requests, on a
    /// Runtime API of its own: the killed process's long poll would take the next event.
    async fn restart(&mut self, vars: HashMap<String, String>) {
        self.api = RuntimeApi::start().await;
        self.lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_migrate"), &self.api, vars);
    }

    /// Hands `request` to the function and returns what CloudFormation got back.
    async fn send(&mut self, request: String) -> Value {
        self.lambda.invoke(&mut self.api, request).await.response();
        self.cloudformation.answer().await
    }
}

/// The response body CloudFormation documents: these fields and no others, `Status`
/// `SUCCESS` or `FAILED`, a `Reason` that is a text (required for `FAILED`; never `null`),
/// string `Data` values, the whole under 4 KiB.
fn assert_documented(answer: &Value) {
    let fields: BTreeSet<&str> = answer
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let allowed = BTreeSet::from([
        "Status",
        "Reason",
        "PhysicalResourceId",
        "StackId",
        "RequestId",
        "LogicalResourceId",
        "NoEcho",
        "Data",
    ]);
    assert!(fields.is_subset(&allowed), "{answer}");
    for required in [
        "Status",
        "Reason",
        "PhysicalResourceId",
        "StackId",
        "RequestId",
        "LogicalResourceId",
    ] {
        assert!(fields.contains(required), "{required}: {answer}");
    }
    assert!(
        answer["Status"] == "SUCCESS" || answer["Status"] == "FAILED",
        "{answer}"
    );
    assert!(
        answer["Reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{answer}"
    );
    if let Some(data) = answer.get("Data") {
        assert!(
            data.as_object().unwrap().values().all(Value::is_string),
            "{answer}"
        );
    }
    assert!(answer.to_string().len() < 4096, "{answer}");
}

/// Every applied migration's version and checksum, in order: what a rollback must not change.
async fn applied(pool: &MySqlPool) -> Vec<(i64, Vec<u8>)> {
    sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A migration a later release applied, unknown to this code.
const NEWER: i64 = 29_991_231_000_001;

async fn apply_a_newer_release(pool: &MySqlPool) {
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (?, 'a later release', TRUE, x'00', 1)",
    )
    .bind(NEWER)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_resource_migrates_declares_the_queues_and_always_answers() {
    let env = TestEnv::unmigrated().await;
    let mut migrate = Migrate::start(env.env_vars()).await;

    let created = migrate
        .send(migrate.cloudformation.request("Create", &version(1), None))
        .await;
    let updated = migrate
        .send(
            migrate
                .cloudformation
                .request("Update", &version(2), Some(&version(1))),
        )
        .await;
    let deleted = migrate
        .send(migrate.cloudformation.request("Delete", &version(2), None))
        .await;

    assert_eq!(created["Status"], "SUCCESS", "{created}");
    assert_eq!(created["PhysicalResourceId"], "paybus-migration");
    assert_eq!(created["RequestId"], "Create-1");
    assert_eq!(created["LogicalResourceId"], "Migration");
    assert_eq!(
        created["Data"]["Migrations"],
        MIGRATOR.iter().count().to_string()
    );
    assert_eq!(
        applied(&env.db).await.len(),
        MIGRATOR.iter().count(),
        "every migration applied"
    );
    let services = services_on(&env.settings, &[]).await;
    let channel = services.connection().create_channel().await.unwrap();
    for function in paybus_catalog::queues(&Default::default()) {
        // A passive declare fails (and panics) for a queue that does not exist.
        queue_depth(&channel, &function.queue()).await;
        queue_depth(&channel, &function.dead_letter_queue()).await;
    }
    assert_eq!(updated["Status"], "SUCCESS", "{updated}");
    assert_eq!(updated["PhysicalResourceId"], "paybus-migration");
    assert!(
        updated["Reason"]
            .as_str()
            .unwrap()
            .contains("migrations applied"),
        "{updated}"
    );
    assert_eq!(deleted["Status"], "SUCCESS", "{deleted}");
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM _sqlx_migrations").await as usize,
        MIGRATOR.iter().count(),
        "deleting the stack touched nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_seals_plaintext_secrets_with_the_key_it_fetched_from_secrets_manager() {
    const KEY_ARN: &str =
        "arn:aws:secretsmanager:eu-central-1:123456789012:secret:paybus-secrets-key-AbCdEf";
    let env = TestEnv::new().await;
    sqlx::query(
        "INSERT INTO partners (name, webhook_secret) VALUES ('acme', 'acme-plaintext-secret-01')",
    )
    .execute(&env.db)
    .await
    .unwrap();
    let extension = SecretsExtension::start(HashMap::from([(
        KEY_ARN.to_owned(),
        paybus_testkit::SECRETS_KEY.to_owned(),
    )]))
    .await;
    // As the template deploys it: the key only as a reference, never as a plain variable.
    let mut vars = env.env_vars();
    vars.remove("PAYBUS_SECRETS_KEY");
    vars.extend(extension.vars());
    vars.insert("PAYBUS_SECRETS_KEY_FROM".to_owned(), KEY_ARN.to_owned());
    let mut migrate = Migrate::start(vars).await;

    let created = migrate
        .send(migrate.cloudformation.request("Create", &version(1), None))
        .await;

    assert_eq!(created["Status"], "SUCCESS", "{created}");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM partners WHERE webhook_secret IS NOT NULL"
        )
        .await,
        0,
        "no plaintext secret is left"
    );
    assert_eq!(
        scalar(&env.db, "SELECT COUNT(*) FROM partner_webhook_secrets").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_after_a_newer_migration_answers_success_and_changes_nothing() {
    // A deploy of version 2 applied a newer migration, then failed further on: CloudFormation
    // rolls back, and the restored version-1 code gets an Update back to itself.
    let env = TestEnv::new().await;
    apply_a_newer_release(&env.db).await;
    let before = applied(&env.db).await;
    let mut migrate = Migrate::start(env.env_vars()).await;

    let rolled_back = migrate
        .send(
            migrate
                .cloudformation
                .request("Update", &version(1), Some(&version(2))),
        )
        .await;

    assert_eq!(rolled_back["Status"], "SUCCESS", "{rolled_back}");
    assert_eq!(rolled_back["PhysicalResourceId"], "paybus-migration");
    assert!(
        rolled_back["Reason"]
            .as_str()
            .unwrap()
            .contains("a rollback"),
        "{rolled_back}"
    );
    assert_eq!(
        applied(&env.db).await,
        before,
        "the rollback changed nothing"
    );
    // The hazard was real: the embedded migrations refuse this database.
    let refused = MIGRATOR.run(&env.db).await.unwrap_err().to_string();
    assert!(
        refused.contains("previously applied but is missing"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_answers_success_without_reaching_the_database() {
    let env = TestEnv::unmigrated().await;
    let vars = env.env_vars_with_database_unreachable();
    let mut migrate = Migrate::start(vars).await;

    let rolled_back = migrate
        .send(
            migrate
                .cloudformation
                .request("Update", &version(6), Some(&version(7))),
        )
        .await;
    // The same database, forward: the reachability is what the rollback did not need.
    let forward = migrate
        .send(
            migrate
                .cloudformation
                .request("Update", &version(8), Some(&version(7))),
        )
        .await;

    assert_eq!(rolled_back["Status"], "SUCCESS", "{rolled_back}");
    assert_eq!(forward["Status"], "FAILED", "{forward}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_release_deployed_again_on_a_newer_schema_succeeds_without_migrating() {
    // `git checkout <older release> && sam deploy`: a new Lambda version (a forward Update),
    // older code, a database a later release migrated.
    let env = TestEnv::new().await;
    apply_a_newer_release(&env.db).await;
    let before = applied(&env.db).await;
    let mut migrate = Migrate::start(env.env_vars()).await;

    let updated = migrate
        .send(
            migrate
                .cloudformation
                .request("Update", &version(4), Some(&version(3))),
        )
        .await;

    assert_eq!(updated["Status"], "SUCCESS", "{updated}");
    let reason = updated["Reason"].as_str().unwrap();
    assert!(reason.contains("the database is ahead"), "{reason}");
    assert!(reason.contains(&NEWER.to_string()), "{reason}");
    assert_eq!(applied(&env.db).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_a_failed_answer_with_the_reason_not_silence() {
    let env = TestEnv::unmigrated().await;
    let vars = env.env_vars_with_database_unreachable();
    let mut migrate = Migrate::start(vars).await;

    let failed = migrate
        .send(migrate.cloudformation.request("Create", &version(1), None))
        .await;

    assert_eq!(failed["Status"], "FAILED", "{failed}");
    let reason = failed["Reason"].as_str().unwrap();
    assert!(reason.contains("cannot reach the database"), "{reason}");
    assert!(
        !reason.contains(paybus_testkit::UNREACHABLE_DATABASE_PASSWORD),
        "no password in CloudFormation's events: {reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_type_this_release_does_not_know_is_answered() {
    let env = TestEnv::unmigrated().await;
    let mut migrate = Migrate::start(env.env_vars()).await;

    let answered = migrate
        .send(migrate.cloudformation.request("Import", &version(1), None))
        .await;

    assert_eq!(answered["Status"], "SUCCESS", "{answered}");
    assert_eq!(
        scalar(
            &env.db,
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
        )
        .await,
        0,
        "nothing was migrated"
    );
}

/// Messages ready in `queue`, `None` when it does not exist.
async fn ready(services: &paybus_bus::Services, queue: &str) -> Option<u32> {
    paybus_testkit::queue_state(services, queue)
        .await
        .map(|(messages, _)| messages)
}

async fn ping(services: &paybus_bus::Services, ping_id: u64) {
    let message = Envelope::new(paybus_canary::Ping { ping_id })
        .to_outgoing()
        .unwrap();
    services.publisher().publish_event(&message).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_that_shards_a_function_retires_its_queue_and_its_rollback_restores_it() {
    let env = TestEnv::new().await;
    let one = unsharded_queues();
    let four_shards = Shards::default().with("canary", 4);
    let sharded: Vec<String> = paybus_catalog::queues(&four_shards)
        .iter()
        .map(|q| q.queue())
        .collect();
    let mut migrate = Migrate::start(env.env_vars()).await;
    migrate
        .send(migrate.cloudformation.request("Create", &version(1), None))
        .await;
    let services = services_on(&env.settings, &[]).await;
    for ping_id in 1..=5 {
        ping(&services, ping_id).await;
    }

    // Version 2 shards the canary: a process with its layout gets the Update.
    let mut vars = env.env_vars();
    vars.insert("PAYBUS_SHARDS".to_owned(), four_shards.to_string());
    migrate.restart(vars).await;
    let sharding = migrate
        .send(migrate.cloudformation.request_with(
            "Update",
            &version(2),
            &sharded,
            Some((&version(1), &one)),
        ))
        .await;
    ping(&services, 6).await;
    let after_sharding = (
        ready(&services, "paybus.canary").await,
        ready(&services, "paybus.canary.s0").await.unwrap()
            + ready(&services, "paybus.canary.s1").await.unwrap()
            + ready(&services, "paybus.canary.s2").await.unwrap()
            + ready(&services, "paybus.canary.s3").await.unwrap(),
    );

    // The deploy fails later on: CloudFormation rolls back, version 1's code gets the Update.
    migrate.restart(env.env_vars()).await;
    let rolled_back = migrate
        .send(migrate.cloudformation.request_with(
            "Update",
            &version(1),
            &one,
            Some((&version(2), &sharded)),
        ))
        .await;
    ping(&services, 7).await;

    assert_eq!(sharding["Status"], "SUCCESS", "{sharding}");
    let reason = sharding["Reason"].as_str().unwrap();
    assert!(reason.contains("paybus.canary (5)"), "{reason}");
    assert!(reason.contains("--drain-retired"), "{reason}");
    assert_eq!(
        after_sharding,
        (Some(5), 1),
        "the sixth ping went to a shard"
    );
    assert_eq!(rolled_back["Status"], "SUCCESS", "{rolled_back}");
    assert!(
        rolled_back["Reason"]
            .as_str()
            .unwrap()
            .contains("declared again"),
        "{rolled_back}"
    );
    assert_eq!(
        ready(&services, "paybus.canary").await,
        Some(6),
        "the rollback routes the canary's messages to its one queue again"
    );
}
