//! The template's parameters: the broker, the secrets' references, the network, capacity, each
//! workflow's plain settings, operations and deployments.

use super::{
    MAX_FUNCTION_TIMEOUT_S,
    deployments::{DEPLOYMENT_TYPE, deployment_type_parameter},
    needs::{IDENTITY_SETTINGS, PLAIN_SETTINGS, PlainSetting, SECRETS},
    pascal_case,
    policies::SECRETS_KMS_KEYS,
};
use crate::{
    FUNCTIONS,
    yaml::{Node, list, map},
};

/// Every parameter, in the order an operator fills them in.
pub(super) fn parameters() -> Node {
    let mut p = map! {};
    broker_parameters(&mut p);
    secrets_parameters(&mut p);
    network_parameters(&mut p);
    capacity_parameters(&mut p);
    workflow_parameters(&mut p);
    operations_parameters(&mut p);
    p.insert_commented(
        Some("Deployments: how each function's alias moves to a new version."),
        DEPLOYMENT_TYPE,
        deployment_type_parameter(),
    );
    consumption_parameters(&mut p);
    p
}

/// `<Function>Enabled`: the Amazon MQ trigger's `Enabled`, AWS's form of `paybus functions
/// pause` (the runbook's step: update the stack with it false; the messages wait in the
/// queue; true again drains them).
pub(super) fn enabled_parameter(function: &str) -> String {
    format!("{}Enabled", pascal_case(function))
}

/// One switch per function's triggers.
pub(super) fn consumption_parameters(p: &mut Node) {
    for (n, function) in FUNCTIONS.iter().enumerate() {
        p.insert_commented(
            (n == 0).then_some(
                "Consumption: false pauses a function's triggers (its messages wait in its queue).",
            ),
            &enabled_parameter(function.name),
            map! {
                "Type" => "String",
                "Description" => format!("Whether {} consumes its queue (false: paused; its messages wait)", function.name),
                "Default" => "true",
                "AllowedValues" => list!["true", "false"],
            },
        );
    }
}

/// The broker and the credentials the event source mappings read the queues with.
pub(super) fn broker_parameters(p: &mut Node) {
    p.insert_commented(
        Some("The broker and how the event source mappings log in."),
        "BrokerArn",
        string("ARN of the Amazon MQ for RabbitMQ broker (arn:aws:mq:<region>:<account>:broker:<name>:<id>)"),
    );
    p.insert(
        "BrokerVirtualHost",
        map! { "Type" => "String", "Description" => "The broker's virtual host paybus uses", "Default" => "/" },
    );
    p.insert(
        "BrokerCredentialsSecretArn",
        string("Secrets Manager secret {\"username\": ..., \"password\": ...} the event source mappings read the queues with"),
    );
}

/// Where each secret is kept (references only), and the KMS keys that encrypt them.
pub(super) fn secrets_parameters(p: &mut Node) {
    for (n, secret) in SECRETS.iter().enumerate() {
        p.insert_commented(
            (n == 0).then_some(
                "Secrets: references only; each function fetches what it needs at start-up\n(PAYBUS_*_FROM) and may read only those.",
            ),
            secret.parameter,
            map! {
                "Type" => "String",
                "Description" => format!(
                    "Where {} is kept: a Secrets Manager secret's ARN or name, either with #<key> for one key of a JSON secret, or an SSM parameter (/path or ARN)",
                    secret.description
                ),
                "MinLength" => 1i64,
            },
        );
    }
    p.insert(
        SECRETS_KMS_KEYS,
        map! {
            "Type" => "CommaDelimitedList",
            "Description" => "ARNs of the customer-managed KMS keys the secrets and SecureString parameters above (and the broker credentials) are encrypted with; empty for AWS-managed keys",
            "Default" => "",
        },
    );
    p.insert(
        "SecretsExtensionLayerArn",
        string("ARN of the AWS Parameters and Secrets Lambda Extension layer for arm64 in this region (see infra/aws/README.md)"),
    );
}

/// The subnets and security groups the functions run in.
pub(super) fn network_parameters(p: &mut Node) {
    p.insert_commented(
        Some("The network: the functions reach the database and the broker from these subnets."),
        "SubnetIds",
        map! { "Type" => "List<AWS::EC2::Subnet::Id>", "Description" => "Private subnets with a route to the database, the broker, Secrets Manager (endpoint or NAT) and S3 (for the migration's answer)" },
    );
    p.insert(
        "SecurityGroupIds",
        map! { "Type" => "List<AWS::EC2::SecurityGroup::Id>", "Description" => "Security groups allowed to reach the database (3306) and the broker (5671)" },
    );
}

/// Batches, concurrency, memory, timeouts, the sweeper's schedule and the API's throttling.
pub(super) fn capacity_parameters(p: &mut Node) {
    p.insert_commented(
        Some("Batches and concurrency."),
        "BatchSize",
        number(
            "Messages per Amazon MQ batch (one invocation)",
            100,
            1,
            10_000,
        ),
    );
    p.insert(
        "BatchingWindowSeconds",
        number(
            "How long a mapping gathers messages before invoking with a smaller batch",
            1,
            0,
            300,
        ),
    );
    p.insert(
        "LambdaConcurrency",
        number(
            "PAYBUS_LAMBDA_CONCURRENCY: messages of one batch processed at once",
            64,
            1,
            65_535,
        ),
    );
    p.insert(
        "DatabaseMaxConnections",
        number(
            "PAYBUS_DB_MAX_CONNECTIONS: pool size of each execution environment",
            32,
            1,
            1_000,
        ),
    );
    p.insert(
        "FunctionMemorySize",
        number(
            "Memory of each function (MB); CPU grows with it",
            512,
            128,
            10_240,
        ),
    );
    p.insert(
        "FunctionTimeout",
        number(
            "Seconds one invocation (a whole batch) may take; at most 840 (AWS: an Amazon MQ-triggered function over 14 minutes may get its batch again while still running)",
            120,
            10,
            MAX_FUNCTION_TIMEOUT_S,
        ),
    );
    p.insert(
        "SweeperSchedule",
        map! { "Type" => "String", "Description" => "How often the sweeper runs every job once (EventBridge rate or cron)", "Default" => "rate(1 minute)" },
    );
    p.insert(
        "ApiThrottlingRateLimit",
        number(
            "Requests per second the HTTP API accepts (steady)",
            200,
            1,
            10_000,
        ),
    );
    p.insert(
        "ApiThrottlingBurstLimit",
        number("Requests the HTTP API accepts in a burst", 400, 1, 10_000),
    );
}

/// The plain (not secret) settings: the workflows', then the identity provider's.
pub(super) fn workflow_parameters(p: &mut Node) {
    plain_parameters(p, PLAIN_SETTINGS, "Workflow settings (not secrets).");
    plain_parameters(
        p,
        IDENTITY_SETTINGS,
        "Who signs in (the API only): the identity provider and break-glass.",
    );
}

pub(super) fn plain_parameters(p: &mut Node, settings: &[PlainSetting], heading: &'static str) {
    for (n, setting) in settings.iter().enumerate() {
        let mut parameter = map! {
            "Type" => "String",
            "Description" => setting.description,
            "Default" => setting.default,
        };
        if !setting.allowed.is_empty() {
            parameter.insert(
                "AllowedValues",
                Node::List(setting.allowed.iter().map(|v| Node::from(*v)).collect()),
            );
        }
        p.insert_commented((n == 0).then_some(heading), setting.parameter, parameter);
    }
}

/// Logging, log retention and where alarms go.
pub(super) fn operations_parameters(p: &mut Node) {
    p.insert_commented(
        Some("Operations."),
        "LogLevel",
        map! { "Type" => "String", "Description" => "RUST_LOG of every function", "Default" => "info" },
    );
    p.insert(
        "LogRetentionInDays",
        map! {
            "Type" => "Number",
            "Description" => "How long the functions' logs are kept",
            "Default" => 30i64,
            "AllowedValues" => list![1i64, 3i64, 5i64, 7i64, 14i64, 30i64, 60i64, 90i64, 120i64, 150i64, 180i64, 365i64, 400i64, 545i64, 731i64, 1096i64, 1827i64, 2192i64, 2557i64, 2922i64, 3288i64, 3653i64],
        },
    );
    p.insert(
        "AlarmTopicArn",
        map! { "Type" => "String", "Description" => "SNS topic the alarms notify (empty: alarms without notifications)", "Default" => "" },
    );
}

/// A required `String` parameter.
pub(super) fn string(description: &str) -> Node {
    map! { "Type" => "String", "Description" => description }
}

/// A `Number` parameter with its bounds.
pub(super) fn number(description: &str, default: i64, min: i64, max: i64) -> Node {
    map! {
        "Type" => "Number",
        "Description" => description,
        "Default" => default,
        "MinValue" => min,
        "MaxValue" => max,
    }
}
