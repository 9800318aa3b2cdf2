//! The AWS SAM template is the catalog's: every function has its Lambda on its own queue,
//! every dead-letter queue (and `paybus.unrouted`) feeds the recorder and has an alarm, the
//! shipped file is what `paybus template` prints, and `cfn-lint` (which translates SAM
//! offline) finds nothing wrong with it.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_testkit::repository;
use std::process::Command;

use paybus_bus::topology::{UNROUTED_QUEUE, dead_letter_queue_name};
use paybus_catalog::{
    FUNCTIONS, queues,
    sam::{self, TEMPLATE_PATH, pascal_case},
};
use paybus_config::Shards;
use serde_json::Value;

/// The queues of every `MQ` event of a function resource.
fn mq_queues(template: &Value, function_id: &str) -> Vec<String> {
    let Some(events) = template["Resources"][function_id]["Properties"]["Events"].as_object()
    else {
        return Vec::new();
    };
    events
        .values()
        .filter(|event| event["Type"] == "MQ")
        .flat_map(|event| {
            event["Properties"]["Queues"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|queue| queue.as_str().map(str::to_owned))
        .collect()
}

/// What the template misses for the catalog in the layout `shards`, read from the template
/// alone: a function without its Lambda, a Lambda without an MQ event on each of its queues
/// (one per shard), a dead-letter queue the recorder does not read or no alarm watches, the
/// layout missing from the functions' environment or the migration's queues.
fn problems_with(template: &Value, shards: &Shards) -> Vec<String> {
    let mut problems = Vec::new();
    let recorder = mq_queues(template, "DeadLettersFunction");
    // Every dimension value of every alarm (a queue alarm names its queue).
    let alarmed: Vec<Value> = template["Resources"]
        .as_object()
        .into_iter()
        .flat_map(|resources| resources.values())
        .filter(|r| r["Type"] == "AWS::CloudWatch::Alarm")
        .flat_map(|r| {
            r["Properties"]["Dimensions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|dimension| dimension["Value"].clone())
        .collect();
    for function in FUNCTIONS {
        let id = format!("{}Function", pascal_case(function.name));
        let resource = &template["Resources"][&id];
        if resource["Type"] != "AWS::Serverless::Function" {
            problems.push(format!("{}: no Lambda ({id})", function.name));
            continue;
        }
        if resource["Metadata"]["BuildProperties"]["Binary"] != function.name {
            problems.push(format!("{}: {id} does not build its binary", function.name));
        }
        let own: Vec<String> = function
            .queue
            .queues_in(shards)
            .iter()
            .map(|q| q.queue())
            .collect();
        if mq_queues(template, &id) != own {
            problems.push(format!(
                "{}: {id} has no MQ event on each of {own:?} alone",
                function.name
            ));
        }
        let dlq = dead_letter_queue_name(function.name);
        if !recorder.contains(&dlq) {
            problems.push(format!("{dlq}: the dead-letter recorder does not read it"));
        }
        if !alarmed.contains(&Value::from(dlq.as_str())) {
            problems.push(format!("{dlq}: no alarm on its depth"));
        }
    }
    if !recorder.iter().any(|q| q == UNROUTED_QUEUE) {
        problems.push(format!(
            "{UNROUTED_QUEUE}: the dead-letter recorder does not read it"
        ));
    }
    let layout = &template["Globals"]["Function"]["Environment"]["Variables"][Shards::VARIABLE];
    let expected_layout = if shards.is_empty() {
        Value::Null
    } else {
        Value::from(shards.to_string())
    };
    if *layout != expected_layout {
        problems.push(format!(
            "the functions get {layout} as {}",
            Shards::VARIABLE
        ));
    }
    let declared = &template["Resources"]["Migration"]["Properties"]["Queues"];
    let every: Vec<String> = queues(shards).iter().map(|q| q.queue()).collect();
    if *declared != serde_json::json!(every) {
        problems.push(format!("the migration declares {declared}, not {every:?}"));
    }
    problems
}

fn problems(template: &Value) -> Vec<String> {
    problems_with(template, &Shards::default())
}

#[test]
fn every_catalog_function_has_its_lambda_its_queue_and_a_recorded_alarmed_dlq() {
    let template = sam::template().to_json();

    assert_eq!(problems(&template), Vec::<String>::new());
}

#[test]
fn a_function_missing_from_the_template_is_caught() {
    // The control: the same check on a template that lost a function's event and its DLQ's
    // recorder event.
    let mut template = sam::template().to_json();
    let function = FUNCTIONS[1].name;
    let id = format!("{}Function", pascal_case(function));
    template["Resources"][&id]["Properties"]["Events"] = serde_json::json!({});
    let recorder_events = template["Resources"]["DeadLettersFunction"]["Properties"]["Events"]
        .as_object_mut()
        .unwrap();
    recorder_events.remove(&format!("{}DeadLetters", pascal_case(function)));
    let removed_lambda = FUNCTIONS[2].name;
    template["Resources"]
        .as_object_mut()
        .unwrap()
        .remove(&format!("{}Function", pascal_case(removed_lambda)));

    let found = problems(&template);

    assert!(
        found
            .iter()
            .any(|p| p.contains(&format!("{id} has no MQ event"))),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains(&format!("paybus.{function}.dlq: the dead-letter recorder"))),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains(&format!("{removed_lambda}: no Lambda"))),
        "{found:?}"
    );
    // The unsharded template checked as a sharded layout's is caught too.
    let sharded = Shards::default().with(FUNCTIONS[0].name, 4);
    let found = problems_with(&sam::template().to_json(), &sharded);
    assert!(
        found
            .iter()
            .any(|p| p.contains("has no MQ event on each of")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|p| p.contains("PAYBUS_SHARDS")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|p| p.contains("the migration declares")),
        "{found:?}"
    );
}

#[test]
fn every_lambda_builds_a_binary_of_its_crate() {
    for lambda in sam::deployables() {
        let manifest =
            std::fs::read_to_string(repository().join(&lambda.crate_dir).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("{}: {e}", lambda.crate_dir));
        assert!(
            manifest.contains(&format!("[[bin]]\nname = \"{}\"", lambda.binary)),
            "{}/Cargo.toml must declare the binary {:?}",
            lambda.crate_dir,
            lambda.binary
        );
    }
}

/// The layout a generated template was made for: its `# Shard layout: PAYBUS_SHARDS=…` line
/// (none: unsharded).
fn layout_of(template: &str) -> Shards {
    template
        .lines()
        .find_map(|line| line.strip_prefix("# Shard layout: PAYBUS_SHARDS="))
        .map(|layout| Shards::parse(layout).unwrap())
        .unwrap_or_default()
}

#[test]
fn the_shipped_template_is_the_catalogs() {
    let shipped = std::fs::read_to_string(repository().join(TEMPLATE_PATH)).unwrap_or_default();
    // A deployment may ship a sharded template: it is the catalog's for its own layout.
    let layout = layout_of(&shipped);

    assert!(
        shipped == sam::template_yaml_with(&layout),
        "{TEMPLATE_PATH} is not the catalog's; regenerate with: PAYBUS_SHARDS='{layout}' cargo run -q -p paybus -- template > {TEMPLATE_PATH}"
    );
}

#[test]
fn a_generated_template_names_its_layout() {
    let layout = Shards::default().with("grant-bonus", 3);

    assert_eq!(layout_of(&sam::template_yaml_with(&layout)), layout);
    assert_eq!(layout_of(&sam::template_yaml()), Shards::default());
}

/// The cfn-lint `infra/aws/tools.sh lint` installs into the repository's venv, else one on
/// `PATH`.
fn cfn_lint() -> std::path::PathBuf {
    let venv = repository().join(".local/aws-venv/bin/cfn-lint");
    if venv.exists() {
        venv
    } else {
        "cfn-lint".into()
    }
}

/// cfn-lint with every rule: its informational checks too (`I…`, e.g. a stateful resource
/// without a deletion policy), and the experimental ones.
const EVERY_RULE: [&str; 3] = ["--include-checks", "I", "--include-experimental"];

#[test]
fn cfn_lint_passes_on_the_shipped_template_with_every_rule() {
    let output = Command::new(cfn_lint())
        .args(EVERY_RULE)
        .arg("--")
        .arg(TEMPLATE_PATH)
        .current_dir(repository())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run cfn-lint ({e}): install it with infra/aws/tools.sh lint (infra/test.sh does)")
        });

    assert!(
        output.status.success(),
        "cfn-lint {TEMPLATE_PATH}:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn cfn_lint_fails_a_template_whose_mq_event_lost_its_broker() {
    // The control: the same lint on the catalog's template with one broken MQ event.
    let mut template = sam::template().to_json();
    let id = format!("{}Function", pascal_case(FUNCTIONS[0].name));
    template["Resources"][&id]["Properties"]["Events"]["Queue"]["Properties"]
        .as_object_mut()
        .unwrap()
        .remove("Broker");
    let path = std::env::temp_dir().join(format!("paybus-broken-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string_pretty(&template).unwrap()).unwrap();

    let output = Command::new(cfn_lint()).arg(&path).output().unwrap();
    let _ = std::fs::remove_file(&path);

    assert!(
        !output.status.success(),
        "cfn-lint accepted an MQ event without a broker"
    );
}

#[test]
fn a_four_shard_function_gets_four_triggers_and_lints_clean() {
    let shards = Shards::default().with("confirm-withdrawal", 4);
    let template = sam::template_with(&shards).to_json();

    assert_eq!(problems_with(&template, &shards), Vec::<String>::new());
    assert_eq!(
        mq_queues(&template, "ConfirmWithdrawalFunction"),
        [
            "paybus.confirm-withdrawal.s0",
            "paybus.confirm-withdrawal.s1",
            "paybus.confirm-withdrawal.s2",
            "paybus.confirm-withdrawal.s3"
        ]
    );
    let path = std::env::temp_dir().join(format!("paybus-sharded-{}.yaml", std::process::id()));
    std::fs::write(&path, sam::template_yaml_with(&shards)).unwrap();
    let output = Command::new(cfn_lint())
        .args(EVERY_RULE)
        .arg("--")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        output.status.success(),
        "cfn-lint on the sharded template:\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
}
