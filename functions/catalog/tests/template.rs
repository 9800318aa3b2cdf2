//! The AWS SAM template is the catalog's: every function has its Lambda on its own queue,
//! every dead-letter queue (and `paybus.unrouted`) feeds the recorder and has an alarm, every
//! Lambda that takes traffic deploys gradually behind its alias, watched by the alarms that
//! matter for it, the shipped file is what `paybus template` prints, and `cfn-lint` (which
//! translates SAM offline) finds nothing wrong with it.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_testkit::repository;
use std::process::Command;

use paybus_bus::{
    dead_letter::RECORDED_LINES,
    topology::{UNROUTED_QUEUE, dead_letter_queue_name},
};
use paybus_catalog::{
    FUNCTIONS, queues,
    sam::{self, TEMPLATE_PATH, pascal_case},
};
use paybus_config::Shards;
use paybus_maintenance::auditor::VIOLATION_LINE;
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

/// What a deployment must be watched by: a signal an alarm of the template stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Signal {
    /// `AWS/Lambda` `Errors` of this function resource.
    Errors(String),
    /// New dead letters of this catalog function: the recorder's log, counted.
    DeadLetters(String),
    /// The continuous auditor's violations: the sweeper's log, counted.
    AuditViolations,
    /// The HTTP API's 5xx answers.
    Api5xx,
}

/// The signals each Lambda's deployment must be watched by, from the catalog: every Lambda but
/// `migrate` (only CloudFormation invokes it) its own errors and the auditor's violations (any
/// Lambda that moves money can cause one); a catalog function also its new dead letters; the
/// API its 5xx answers.
fn expected_signals() -> Vec<(String, Vec<Signal>)> {
    sam::deployables()
        .into_iter()
        .filter(|lambda| lambda.binary != "migrate")
        .map(|lambda| {
            let id = format!("{}Function", lambda.logical_id);
            let mut signals = vec![Signal::Errors(id.clone()), Signal::AuditViolations];
            if FUNCTIONS.iter().any(|f| f.name == lambda.binary) {
                signals.push(Signal::DeadLetters(lambda.binary.to_owned()));
            }
            if lambda.binary == "api" {
                signals.push(Signal::Api5xx);
            }
            (id, signals)
        })
        .collect()
}

/// The log group resource Lambda `binary` writes to.
fn log_group_of(template: &Value, binary: &str) -> Value {
    let id = format!("{}Function", pascal_case(binary));
    template["Resources"][&id]["Properties"]["LoggingConfig"]["LogGroup"].clone()
}

/// The metric filter feeding the metric `alarm` watches, if one does.
fn metric_filter_of<'t>(template: &'t Value, alarm: &Value) -> Option<&'t Value> {
    template["Resources"].as_object()?.values().find(|r| {
        r["Type"] == "AWS::Logs::MetricFilter"
            && r["Properties"]["MetricTransformations"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| {
                    t["MetricNamespace"] == alarm["Properties"]["Namespace"]
                        && t["MetricName"] == alarm["Properties"]["MetricName"]
                })
    })
}

/// What alarm resource `alarm` watches, read from it (and from the metric filter of a log
/// metric): its namespace, metric and dimensions, not its name.
fn signal_of(template: &Value, alarm: &Value) -> Option<Signal> {
    let properties = &alarm["Properties"];
    let dimension = |name: &str| {
        properties["Dimensions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["Name"] == name)
            .map(|d| d["Value"].clone())
    };
    match (
        properties["Namespace"].as_str(),
        properties["MetricName"].as_str(),
    ) {
        (Some("AWS/Lambda"), Some("Errors")) => Some(Signal::Errors(
            dimension("FunctionName")?["Ref"].as_str()?.to_owned(),
        )),
        (Some("AWS/ApiGateway"), Some("5xx")) => {
            (dimension("ApiId")? == serde_json::json!({"Ref": "HttpApi"})).then_some(Signal::Api5xx)
        }
        _ => {
            let filter = &metric_filter_of(template, alarm)?["Properties"];
            let pattern = filter["FilterPattern"].as_str()?;
            let quoted = |line: &str| pattern.contains(&format!("\"{line}\""));
            if filter["LogGroupName"] == log_group_of(template, "dead-letters")
                && RECORDED_LINES.iter().all(|line| quoted(line))
                && filter["MetricTransformations"][0]["Dimensions"]
                    == serde_json::json!([{"Key": "function", "Value": "$.function"}])
            {
                let function = dimension("function")?;
                return Some(Signal::DeadLetters(function.as_str()?.to_owned()));
            }
            (filter["LogGroupName"] == log_group_of(template, "sweeper") && quoted(VIOLATION_LINE))
                .then_some(Signal::AuditViolations)
        }
    }
}

/// The alarm a deployment's entry names, with its logical id: a `Ref` to it, or its
/// `AlarmName`.
fn alarm_named<'t>(template: &'t Value, entry: &Value) -> Option<(String, &'t Value)> {
    let resources = template["Resources"].as_object()?;
    if let Some(id) = entry["Ref"].as_str() {
        return resources.get(id).map(|alarm| (id.to_owned(), alarm));
    }
    resources
        .iter()
        .find(|(_, r)| {
            r["Type"] == "AWS::CloudWatch::Alarm" && r["Properties"]["AlarmName"] == *entry
        })
        .map(|(id, alarm)| (id.clone(), alarm))
}

/// Whether `alarm` is a deployment's signal: a count of events that is back to OK within five
/// minutes of the last one, not a standing level (a queue's depth, a backlog) that would stop
/// every deployment while it lasts.
fn fits_a_deployment(alarm: &Value) -> bool {
    let properties = &alarm["Properties"];
    let lasts = properties["Period"].as_i64().unwrap_or(i64::MAX)
        * properties["EvaluationPeriods"].as_i64().unwrap_or(i64::MAX);
    properties["Statistic"] == "Sum"
        && properties["TreatMissingData"] == "notBreaching"
        && lasts <= 300
}

/// What the template's deployments miss: a Lambda that takes traffic without the alias its
/// triggers invoke, without a deployment preference whose type is the parameter, or not
/// watched (unless `AllAtOnce`) by each signal that matters for it; an alarm among them that
/// does not fit a deployment; a parameter that does not default to a gradual deployment.
fn deployment_problems(template: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let parameter = &template["Parameters"][sam::DEPLOYMENT_TYPE];
    let allowed = parameter["AllowedValues"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if parameter["Default"] == sam::ALL_AT_ONCE || !allowed.contains(&parameter["Default"]) {
        problems.push(format!("{}: not gradual by default", sam::DEPLOYMENT_TYPE));
    }
    if !allowed.contains(&Value::from(sam::ALL_AT_ONCE)) {
        problems.push(format!(
            "{}: AllAtOnce is not allowed",
            sam::DEPLOYMENT_TYPE
        ));
    }
    for (id, signals) in expected_signals() {
        let properties = &template["Resources"][&id]["Properties"];
        if properties["AutoPublishAlias"] != sam::ALIAS {
            problems.push(format!("{id}: no alias {}", sam::ALIAS));
        }
        let preference = &properties["DeploymentPreference"];
        if preference.is_null() {
            problems.push(format!("{id}: no deployment preference"));
            continue;
        }
        if preference["Type"] != serde_json::json!({"Ref": sam::DEPLOYMENT_TYPE}) {
            problems.push(format!("{id}: its deployment type is not the parameter's"));
        }
        let alarms = &preference["Alarms"]["Fn::If"];
        if alarms[0] != sam::DEPLOYS_GRADUALLY {
            problems.push(format!(
                "{id}: its alarms are not dropped for AllAtOnce alone"
            ));
        }
        let mut watched = Vec::new();
        for entry in alarms[1].as_array().into_iter().flatten() {
            let Some((alarm_id, alarm)) = alarm_named(template, entry) else {
                problems.push(format!("{id}: no alarm {entry}"));
                continue;
            };
            if !fits_a_deployment(alarm) {
                problems.push(format!(
                    "{id}: {alarm_id} does not fit a deployment (not a count back to OK within 5 minutes)"
                ));
            }
            watched.extend(signal_of(template, alarm));
        }
        for signal in signals {
            if !watched.contains(&signal) {
                problems.push(format!("{id}: its deployment is not watched by {signal:?}"));
            }
        }
    }
    problems
}

#[test]
fn every_lambda_that_takes_traffic_deploys_gradually_watched_by_its_signals() {
    let template = sam::template().to_json();

    assert_eq!(deployment_problems(&template), Vec::<String>::new());
    // The scan covered every catalog function and the platform's three: one that found none
    // would pass for nothing.
    assert_eq!(expected_signals().len(), FUNCTIONS.len() + 3);
    let parameter = &template["Parameters"][sam::DEPLOYMENT_TYPE];
    assert_eq!(parameter["Default"], sam::DEFAULT_DEPLOYMENT_TYPE);
}

#[test]
fn a_lambda_missing_its_alias_preference_or_an_alarm_is_caught() {
    // The control: the same check on templates that each lost one thing.
    let template = sam::template().to_json();
    let first = format!("{}Function", pascal_case(FUNCTIONS[0].name));
    let second = format!("{}Function", pascal_case(FUNCTIONS[1].name));
    let alarms = |t: &mut Value, id: &str| -> Vec<Value> {
        t["Resources"][id]["Properties"]["DeploymentPreference"]["Alarms"]["Fn::If"][1]
            .as_array_mut()
            .unwrap()
            .drain(..)
            .collect()
    };
    let found = |edit: &dyn Fn(&mut Value)| {
        let mut broken = template.clone();
        edit(&mut broken);
        deployment_problems(&broken)
    };
    let has = |problems: &[String], expected: &str| {
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "{expected:?} not in {problems:?}"
        );
    };

    let problems = found(&|t| {
        t["Resources"][&first]["Properties"]
            .as_object_mut()
            .unwrap()
            .remove("AutoPublishAlias");
    });
    has(&problems, &format!("{first}: no alias live"));

    let problems = found(&|t| {
        t["Resources"]["DeadLettersFunction"]["Properties"]
            .as_object_mut()
            .unwrap()
            .remove("DeploymentPreference");
    });
    has(&problems, "DeadLettersFunction: no deployment preference");

    // Each signal of a catalog function, dropped in turn.
    for dropped in 0..3 {
        let problems = found(&|t| {
            let mut kept = alarms(t, &first);
            kept.remove(dropped);
            t["Resources"][&first]["Properties"]["DeploymentPreference"]["Alarms"]["Fn::If"][1] =
                Value::Array(kept);
        });
        has(
            &problems,
            &format!("{first}: its deployment is not watched by"),
        );
    }

    // Its dead-letter queue's depth instead of its new dead letters: a standing level.
    let problems = found(&|t| {
        let mut kept = alarms(t, &second);
        kept.retain(|a| !a["Ref"].as_str().unwrap().contains("NewDeadLetters"));
        let depth = format!("{}DeadLetterQueueAlarm", pascal_case(FUNCTIONS[1].name));
        kept.push(serde_json::json!({ "Ref": depth }));
        t["Resources"][&second]["Properties"]["DeploymentPreference"]["Alarms"]["Fn::If"][1] =
            Value::Array(kept);
    });
    has(&problems, "DeadLetterQueueAlarm does not fit a deployment");
    has(
        &problems,
        &format!(
            "{second}: its deployment is not watched by DeadLetters(\"{}\")",
            FUNCTIONS[1].name
        ),
    );

    let problems = found(&|t| {
        let mut kept = alarms(t, "ApiFunction");
        kept.retain(|a| !a.to_string().contains("HttpApi5xx"));
        t["Resources"]["ApiFunction"]["Properties"]["DeploymentPreference"]["Alarms"]["Fn::If"]
            [1] = Value::Array(kept);
    });
    has(
        &problems,
        "ApiFunction: its deployment is not watched by Api5xx",
    );

    // The auditor's metric filter counting another line: no Lambda is watched by violations.
    let problems = found(&|t| {
        let filter = t["Resources"]
            .as_object_mut()
            .unwrap()
            .values_mut()
            .find(|r| {
                r["Type"] == "AWS::Logs::MetricFilter"
                    && r["Properties"]["FilterPattern"]
                        .as_str()
                        .unwrap()
                        .contains(VIOLATION_LINE)
            })
            .unwrap();
        filter["Properties"]["FilterPattern"] = Value::from("{ $.message = \"audit passed\" }");
    });
    has(
        &problems,
        "SweeperFunction: its deployment is not watched by AuditViolations",
    );
}
