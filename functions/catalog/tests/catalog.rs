//! The catalog is the one list: every function crate is in it, and everything derived from it
//! (the shipped RabbitMQ definitions, what `paybus run` starts, the sweeper's jobs, the README's
//! table) agrees with it. A function added to `functions/` without its catalog line, or a
//! catalog line whose queue is missing from the shipped definitions, fails here.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::{collections::BTreeSet, time::Duration};

use paybus_bus::{Context, Envelope, Handler, HandlerError, Message, Outcome, Services, topology};
use paybus_catalog::FUNCTIONS;
use paybus_maintenance::Job;
use paybus_runtime::{
    function::{BuildError, Function, FunctionEntry},
    runner::Runner,
};
use paybus_testkit::{TestEnv, eventually, repository};
use serde::{Deserialize, Serialize};

/// Crates in `functions/` that are not functions themselves.
const NOT_FUNCTIONS: &[&str] = &["catalog", "sweeper", "dead-letters", "migrate"];

#[test]
fn every_function_crate_is_in_the_catalog_and_every_entry_has_its_crate() {
    let crates: BTreeSet<String> = std::fs::read_dir(repository().join("functions"))
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !NOT_FUNCTIONS.contains(&name.as_str()))
        .collect();
    let listed: BTreeSet<String> = FUNCTIONS.iter().map(|f| f.name.to_owned()).collect();

    assert_eq!(
        crates, listed,
        "functions/<name> crates and the catalog's FUNCTIONS must name the same functions"
    );
}

#[test]
fn every_function_binary_is_the_one_line_main() {
    for function in FUNCTIONS {
        let main = std::fs::read_to_string(
            repository()
                .join("functions")
                .join(function.name)
                .join("src/main.rs"),
        )
        .unwrap();
        let code: Vec<&str> = main
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with("//"))
            .collect();
        assert!(
            code.join(" ").contains("paybus_runtime::function::main::<"),
            "functions/{}/src/main.rs must be `paybus_runtime::function::main::<Handler>()`:\n{main}",
            function.name
        );
    }
}

#[test]
fn the_shipped_definitions_are_the_catalogs_topology() {
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repository().join("infra/rabbitmq/definitions.json")).unwrap(),
    )
    .unwrap();
    let queues: BTreeSet<&str> = shipped["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    for function in FUNCTIONS {
        assert!(
            queues.contains(function.queue.queue().as_str())
                && queues.contains(function.queue.dead_letter_queue().as_str()),
            "{} is missing from infra/rabbitmq/definitions.json",
            function.name
        );
    }
    assert_eq!(
        shipped,
        topology::definitions("/", &paybus_catalog::queues(&Default::default())),
        "regenerate with: cargo run -q -p paybus -- topology --definitions > infra/rabbitmq/definitions.json"
    );
}

#[test]
fn the_readme_table_is_the_catalogs() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let table = paybus_catalog::markdown_table();
    assert!(
        readme.contains(&table),
        "README.md must contain the function table; regenerate with: cargo run -q -p paybus -- catalog\n{table}"
    );
}

#[tokio::test]
async fn paybus_run_starts_every_catalog_function_and_its_jobs() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let mut runner = Runner::new(services.clone());

    paybus_catalog::register(&mut runner).unwrap();

    assert_eq!(
        runner.queues(),
        paybus_catalog::queues(&Default::default()).as_slice()
    );
    let jobs = paybus_catalog::jobs(&services).unwrap();
    let mut expected: Vec<&str> = vec!["outbox-relay", "activity-flush"];
    expected.extend(jobs.iter().map(|job| job.name()));
    assert_eq!(runner.job_names(), expected);
    assert!(expected.contains(&"due-notifications"), "{expected:?}");
    assert!(expected.contains(&"bus-sampler"), "{expected:?}");
}

// A function defined here, as a new crate would define it: the one `FunctionEntry::of` line is
// all the platform needs to declare its queue, run it and collect its jobs.

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Shout {
    word: String,
}

impl Message for Shout {
    const TYPE: &'static str = "test.shout";
}

struct Echo;

impl Handler for Echo {
    type Message = Shout;
    const FUNCTION: &'static str = "echo";

    async fn handle(
        &self,
        message: Envelope<Shout>,
        ctx: &Context<'_>,
    ) -> Result<Outcome, HandlerError> {
        let mut uow = ctx.db.begin().await?;
        sqlx::query("INSERT INTO echoes (word) VALUES (?)")
            .bind(message.data.word.to_uppercase())
            .execute(&mut *uow)
            .await?;
        uow.commit().await?;
        Ok(Outcome::Done)
    }
}

impl Function for Echo {
    fn build(_: &Services) -> Result<Self, BuildError> {
        Ok(Echo)
    }

    fn jobs(_: &Services) -> Result<Vec<std::sync::Arc<dyn Job>>, BuildError> {
        Ok(Vec::new())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_entry_is_all_a_new_function_needs() {
    let echo = FunctionEntry::of::<Echo>();
    assert_eq!(echo.queue.queue(), "paybus.echo");
    assert_eq!(echo.queue.routing_key, "test.shout");
    let document = topology::definitions("/", &[echo.queue]);
    let queues: Vec<&str> = document["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        queues,
        ["paybus.echo", "paybus.echo.dlq", "paybus.unrouted"]
    );

    let env = TestEnv::new().await;
    sqlx::query("CREATE TABLE echoes (word VARCHAR(64) NOT NULL)")
        .execute(&env.db)
        .await
        .unwrap();
    // Declared before the first publish, as `paybus run` does before it takes requests.
    let services = env.services(&[echo.queue]).await;
    let mut runner = Runner::new(services.clone());
    echo.add_to(&mut runner).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(runner.run(shutdown.clone()));
    let mut uow = services.outbox.begin().await.unwrap();
    uow.send(&Envelope::new(Shout {
        word: "hello".to_owned(),
    }))
    .await
    .unwrap();
    uow.commit().await.unwrap();

    let echoed = eventually(Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, String>("SELECT word FROM echoes")
            .fetch_optional(&env.db)
            .await
            .unwrap()
            .as_deref()
            == Some("HELLO")
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert!(
        echoed,
        "the new function consumed its message from its own queue"
    );
}
