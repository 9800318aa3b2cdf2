//! The Lambdas: one per catalog function on its queues, the dead-letter recorder, the sweeper,
//! the HTTP API and the migration behind its custom resource, and what they share (`Globals`).
//! Each but the migration is deployed gradually, watched by the alarms that matter for it.

use paybus_bus::topology::{UNROUTED_QUEUE, dead_letter_queue_name};
use paybus_config::Shards;

use super::{
    Deployable, MIGRATE_TIMEOUT_S, MIGRATION_SERVICE_TIMEOUT_S,
    alarms::{
        AUDIT_VIOLATIONS_ALARM, MQ_INVOCATION_FAILED, add_audit_violations,
        add_dead_letters_metric, add_errors_alarm, add_log_group, add_new_dead_letters_alarm,
        add_queue_alarm, alarm,
    },
    deployments::{ALIAS, deploy_gradually},
    needs::{DATABASE_URL, needs},
    parameters::enabled_parameter,
    pascal_case,
    policies::policy,
};
use crate::{
    FUNCTIONS,
    yaml::{Node, get_att, list, map, reference, sub},
};

/// A Lambda's `Environment` (its variables beyond the globals) and `Policies` from its needs.
pub(super) fn add_needs(properties: &mut Node, binary: &str) {
    let needs = needs(binary);
    let mut variables = map! {};
    for secret in &needs.secrets {
        variables.insert(&secret.reference_variable(), reference(secret.parameter));
    }
    for setting in &needs.settings {
        variables.insert(setting.variable, reference(setting.parameter));
    }
    if matches!(&variables, Node::Map(entries) if !entries.is_empty()) {
        properties.insert("Environment", map! { "Variables" => variables });
    }
    let mut secrets = vec![DATABASE_URL];
    secrets.extend(needs.secrets);
    properties.insert("Policies", list![policy(&secrets, triggered_by_mq(binary))]);
}

/// Whether `binary`'s Lambda has Amazon MQ triggers (every catalog function, the recorder).
pub(super) fn triggered_by_mq(binary: &str) -> bool {
    binary == "dead-letters" || FUNCTIONS.iter().any(|f| f.name == binary)
}

/// One Lambda per catalog function on its queue (one trigger per shard), with its log group
/// and alarms.
pub(super) fn add_consumer(
    resources: &mut Node,
    shards: &Shards,
    function: &paybus_runtime::function::FunctionEntry,
) {
    let lambda = Deployable::new(function.name, &format!("functions/{}", function.name));
    let mut properties = common_properties(
        &lambda,
        &format!(
            "paybus {}: consumes {} ({})",
            function.name,
            function.queue.queue(),
            function.queue.routing_key
        ),
    );
    add_needs(&mut properties, function.name);
    let mut events = map! {};
    for queue in function.queue.queues_in(shards) {
        let name = if queue.shard.count > 1 {
            format!("Shard{}", queue.shard.index)
        } else {
            "Queue".to_owned()
        };
        let mut event = mq_event(&queue.queue());
        event.insert("Enabled", reference(&enabled_parameter(function.name)));
        events.insert(&name, map! { "Type" => "MQ", "Properties" => event });
    }
    properties.insert("Events", events);
    deploy_gradually(
        &mut properties,
        vec![
            reference(&lambda.errors_alarm_id()),
            reference(&lambda.new_dead_letters_alarm_id()),
            reference(AUDIT_VIOLATIONS_ALARM),
        ],
    );
    resources.insert_commented(
        Some(&format!(
            "{}: one Lambda on paybus.{} (an infrastructure fault fails the batch; Amazon MQ\nretries it; every handler is idempotent).",
            function.name, function.name
        )),
        &lambda.function_id(),
        function_resource(&lambda, properties),
    );
    add_log_group(resources, &lambda);
    add_errors_alarm(resources, &lambda, MQ_INVOCATION_FAILED);
    add_new_dead_letters_alarm(resources, &lambda);
    add_queue_alarm(
        resources,
        &format!("{}DeadLetterQueueAlarm", lambda.logical_id),
        &dead_letter_queue_name(function.name),
    );
}

/// The dead-letter recorder: one MQ event per dead-letter queue, and paybus.unrouted.
pub(super) fn add_recorder(resources: &mut Node) {
    let recorder = Deployable::new("dead-letters", "functions/dead-letters");
    let mut events = map! {};
    for function in FUNCTIONS {
        events.insert(
            &format!("{}DeadLetters", pascal_case(function.name)),
            mq_event_on(&dead_letter_queue_name(function.name)),
        );
    }
    events.insert("Unrouted", mq_event_on(UNROUTED_QUEUE));
    let mut properties = common_properties(
        &recorder,
        "paybus dead-letter recorder: every paybus.<function>.dlq and paybus.unrouted into the dead_letters table",
    );
    add_needs(&mut properties, recorder.binary);
    properties.insert("Events", events);
    deploy_gradually(
        &mut properties,
        vec![
            reference(&recorder.errors_alarm_id()),
            reference(AUDIT_VIOLATIONS_ALARM),
        ],
    );
    resources.insert_commented(
        Some("The dead-letter recorder: what every function dead-letters ends up in `dead_letters`,\nonce however often a batch is replayed."),
        &recorder.function_id(),
        function_resource(&recorder, properties),
    );
    add_log_group(resources, &recorder);
    add_errors_alarm(resources, &recorder, MQ_INVOCATION_FAILED);
    add_dead_letters_metric(resources, &recorder);
    add_queue_alarm(resources, "UnroutedQueueAlarm", UNROUTED_QUEUE);
    resources.insert(
        "DeadLettersRecordedAlarm",
        alarm(
            "Dead letters arrived (the recorder was invoked): query the dead_letters table and replay or archive them",
            "AWS/Lambda",
            "Invocations",
            list![map! { "Name" => "FunctionName", "Value" => reference(&recorder.function_id()) }],
            "Sum",
            300,
            1,
        ),
    );
}

/// The sweeper: every job once per scheduled invocation.
pub(super) fn add_sweeper(resources: &mut Node) {
    let sweeper = Deployable::new("sweeper", "functions/sweeper");
    let mut properties = common_properties(
        &sweeper,
        "paybus sweeper: outbox relay, due retries, reapers (every function's jobs), on a schedule",
    );
    add_needs(&mut properties, sweeper.binary);
    // Runs overlapping would only contend for the same rows (claims are SKIP LOCKED): one.
    properties.insert("ReservedConcurrentExecutions", 1i64);
    properties.insert(
        "Events",
        map! { "Schedule" => map! {
            "Type" => "Schedule",
            "Properties" => map! { "Schedule" => reference("SweeperSchedule") },
        } },
    );
    deploy_gradually(
        &mut properties,
        vec![
            reference(&sweeper.errors_alarm_id()),
            reference(AUDIT_VIOLATIONS_ALARM),
        ],
    );
    resources.insert_commented(
        Some("The sweeper: in AWS nothing else relays the outbox, re-publishes due retries or reaps."),
        &sweeper.function_id(),
        function_resource(&sweeper, properties),
    );
    add_log_group(resources, &sweeper);
    add_errors_alarm(
        resources,
        &sweeper,
        "a scheduled run failed (a job hit an error, named in the log; the next run does its work again)",
    );
    add_audit_violations(resources, &sweeper);
}

/// The alarm on the HTTP API's 5xx answers, and its name (one per stack).
const API_5XX_ALARM: &str = "HttpApi5xxAlarm";
const API_5XX_ALARM_NAME: &str = "${AWS::StackName}-HttpApi5xx";

/// The HTTP API: the same axum router behind an API Gateway HTTP API.
pub(super) fn add_api(resources: &mut Node) {
    let api = Deployable::new("api", "api");
    let mut properties = common_properties(
        &api,
        "paybus HTTP API: chain-monitor intake and the admin API (the axum router through lambda_http)",
    );
    add_needs(&mut properties, api.binary);
    properties.insert(
        "Events",
        map! { "Http" => map! {
            "Type" => "HttpApi",
            "Properties" => map! { "ApiId" => reference("HttpApi") },
        } },
    );
    // The HTTP API's integration names the API's alias, and the 5xx alarm names the HTTP API:
    // a `Ref` from the alias's deployment to that alarm would close a circle (cfn-lint E3004),
    // so the alarm is given a name and the deployment is watched by that name.
    let api_5xx_name = sub(API_5XX_ALARM_NAME);
    deploy_gradually(
        &mut properties,
        vec![
            reference(&api.errors_alarm_id()),
            api_5xx_name.clone(),
            reference(AUDIT_VIOLATIONS_ALARM),
        ],
    );
    resources.insert_commented(
        Some("The HTTP API: every route ($default) goes to one Lambda running the axum router."),
        &api.function_id(),
        function_resource(&api, properties),
    );
    add_log_group(resources, &api);
    add_errors_alarm(
        resources,
        &api,
        "an invocation failed (API Gateway answered 500 to that request; see the API's log)",
    );
    resources.insert(
        "HttpApi",
        map! {
            "Type" => "AWS::Serverless::HttpApi",
            "Properties" => map! {
                "Description" => "paybus HTTP API",
                "DefaultRouteSettings" => map! {
                    "ThrottlingBurstLimit" => reference("ApiThrottlingBurstLimit"),
                    "ThrottlingRateLimit" => reference("ApiThrottlingRateLimit"),
                },
            },
        },
    );
    let mut api_5xx = alarm(
        "The HTTP API answered 5xx (503: the database was unreachable; 500: see the API's log)",
        "AWS/ApiGateway",
        "5xx",
        list![
            map! { "Name" => "ApiId", "Value" => reference("HttpApi") },
            map! { "Name" => "Stage", "Value" => "$default" },
        ],
        "Sum",
        300,
        1,
    );
    if let Some(alarm_properties) = api_5xx.get_mut("Properties") {
        alarm_properties.insert("AlarmName", api_5xx_name);
    }
    resources.insert(API_5XX_ALARM, api_5xx);
}

/// Migrations and topology: a custom resource every other function depends on.
pub(super) fn add_migration(resources: &mut Node, shards: &Shards) {
    let migrate = Deployable::new("migrate", "functions/migrate");
    let mut properties = common_properties(
        &migrate,
        "paybus migrate: database migrations and the RabbitMQ topology, on every deploy (custom resource)",
    );
    add_needs(&mut properties, migrate.binary);
    // A new version with every code change: the custom resource's `Version` follows it.
    properties.insert("AutoPublishAlias", ALIAS);
    properties.insert("Timeout", MIGRATE_TIMEOUT_S);
    resources.insert_commented(
        Some("Migrations and topology: run by CloudFormation (the Migration custom resource) before\nany other function is created or updated."),
        &migrate.function_id(),
        map! {
            "Type" => "AWS::Serverless::Function",
            "Metadata" => build_metadata(&migrate),
            "Properties" => properties,
        },
    );
    add_log_group(resources, &migrate);
    resources.insert(
        "Migration",
        map! {
            "Type" => "Custom::PaybusMigration",
            "Properties" => map! {
                "ServiceToken" => get_att(&migrate.function_id(), "Arn"),
                "ServiceTimeout" => MIGRATION_SERVICE_TIMEOUT_S,
                "Version" => reference(&format!("{}.Version", migrate.function_id())),
                "Queues" => Node::List(crate::queues(shards).iter().map(|q| Node::from(q.queue())).collect()),
            },
        },
    );
}

pub(super) fn globals(shards: &Shards) -> Node {
    let mut variables = map! {
        "PAYBUS_DATABASE_URL_FROM" => reference("DatabaseUrlSecretArn"),
        "PAYBUS_DB_MAX_CONNECTIONS" => reference("DatabaseMaxConnections"),
        "PAYBUS_LAMBDA_CONCURRENCY" => reference("LambdaConcurrency"),
        "PAYBUS_LOG_FORMAT" => "json",
        "RUST_LOG" => reference("LogLevel"),
    };
    if !shards.is_empty() {
        variables.insert(Shards::VARIABLE, shards.to_string());
    }
    map! {
        "Function" => map! {
            "Runtime" => "provided.al2023",
            "Architectures" => list!["arm64"],
            "Handler" => "bootstrap",
            "MemorySize" => reference("FunctionMemorySize"),
            "Timeout" => reference("FunctionTimeout"),
            "Layers" => list![reference("SecretsExtensionLayerArn")],
            "VpcConfig" => map! {
                "SubnetIds" => reference("SubnetIds"),
                "SecurityGroupIds" => reference("SecurityGroupIds"),
            },
            "Environment" => map! { "Variables" => variables },
        },
    }
}

/// `sam build` builds the binary with cargo-lambda (SAM's `rust-cargolambda` build method).
pub(super) fn build_metadata(lambda: &Deployable) -> Node {
    map! {
        "BuildMethod" => "rust-cargolambda",
        "BuildProperties" => map! { "Binary" => lambda.binary },
    }
}

/// What every Lambda but `migrate` has: its code, its log group, its description.
pub(super) fn common_properties(lambda: &Deployable, description: &str) -> Node {
    map! {
        "Description" => description,
        "CodeUri" => format!("../../{}", lambda.crate_dir),
        "LoggingConfig" => map! {
            "LogFormat" => "JSON",
            "LogGroup" => reference(&lambda.log_group_id()),
        },
    }
}

/// A function resource that waits for the migration (schema and queues exist first).
pub(super) fn function_resource(lambda: &Deployable, properties: Node) -> Node {
    map! {
        "Type" => "AWS::Serverless::Function",
        "DependsOn" => "Migration",
        "Metadata" => build_metadata(lambda),
        "Properties" => properties,
    }
}

/// An MQ event on `queue`.
pub(super) fn mq_event_on(queue: &str) -> Node {
    map! { "Type" => "MQ", "Properties" => mq_event(queue) }
}

/// The properties of an MQ event on `queue`.
pub(super) fn mq_event(queue: &str) -> Node {
    map! {
        "Broker" => reference("BrokerArn"),
        "Queues" => list![queue],
        "SourceAccessConfigurations" => list![
            map! { "Type" => "BASIC_AUTH", "URI" => reference("BrokerCredentialsSecretArn") },
            map! { "Type" => "VIRTUAL_HOST", "URI" => reference("BrokerVirtualHost") },
        ],
        "BatchSize" => reference("BatchSize"),
        "MaximumBatchingWindowInSeconds" => reference("BatchingWindowSeconds"),
    }
}
