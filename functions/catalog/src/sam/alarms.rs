//! Each Lambda's log group and alarms: its errors, every dead-letter queue, each function's new
//! dead letters and the auditor's violations (the last two counted from the recorder's and the
//! sweeper's JSON logs by metric filters: neither is a CloudWatch metric of its own).

use paybus_bus::dead_letter::RECORDED_LINES;
use paybus_maintenance::auditor::VIOLATION_LINE;

use super::Deployable;
use crate::yaml::{Node, list, map, reference, sub};

/// The metric filters' namespace: the stack's own, so two stacks in one account never count
/// each other's lines.
const NAMESPACE: &str = "paybus/${AWS::StackName}";

/// The metric of new dead letters (dimension `function`), from the recorder's log.
const DEAD_LETTERS_METRIC: &str = "DeadLetters";

/// The metric of the auditor's violations, from the sweeper's log.
const AUDIT_VIOLATIONS_METRIC: &str = "AuditViolations";

/// The alarm on any violation the auditor finds: every Lambda's deployment watches it.
pub(super) const AUDIT_VIOLATIONS_ALARM: &str = "AuditViolationsAlarm";

pub(super) fn add_log_group(resources: &mut Node, lambda: &Deployable) {
    resources.insert(
        &lambda.log_group_id(),
        map! {
            "Type" => "AWS::Logs::LogGroup",
            // Logs outlive the stack (and a replacement of the group): an incident is often
            // investigated after a `sam delete` or a failed deploy's rollback.
            "DeletionPolicy" => "Retain",
            "UpdateReplacePolicy" => "Retain",
            "Properties" => map! {
                "LogGroupName" => sub(&format!("/paybus/${{AWS::StackName}}/{}", lambda.binary)),
                "RetentionInDays" => reference("LogRetentionInDays"),
            },
        },
    );
}

/// An `Errors` alarm; `what_failed` says what a failed invocation means for this Lambda.
pub(super) fn add_errors_alarm(resources: &mut Node, lambda: &Deployable, what_failed: &str) {
    resources.insert(
        &lambda.errors_alarm_id(),
        alarm(
            &format!("{}: {what_failed}", lambda.binary),
            "AWS/Lambda",
            "Errors",
            list![map! { "Name" => "FunctionName", "Value" => reference(&lambda.function_id()) }],
            "Sum",
            60,
            1,
        ),
    );
}

/// What a failed invocation of an Amazon MQ-triggered Lambda means.
pub(super) const MQ_INVOCATION_FAILED: &str = "an invocation failed (an infrastructure fault, or an event from a queue that is not its own; Amazon MQ delivers the whole batch again until it succeeds)";

/// A queue that keeps ready messages for 15 minutes: its recorder is not draining it.
pub(super) fn add_queue_alarm(resources: &mut Node, id: &str, queue: &str) {
    resources.insert(
        id,
        alarm(
            &format!("{queue} has kept ready messages for 15 minutes: the dead-letter recorder is not draining it (see its errors)"),
            "AWS/AmazonMQ",
            "MessageReadyCount",
            list![
                map! { "Name" => "Broker", "Value" => map! { "Fn::Select" => list![6i64, map! { "Fn::Split" => list![":", reference("BrokerArn")] }] } },
                map! { "Name" => "VirtualHost", "Value" => reference("BrokerVirtualHost") },
                map! { "Name" => "Queue", "Value" => queue },
            ],
            "Maximum",
            300,
            3,
        ),
    );
}

/// The metric filter counting every failure the recorder records (its WARN lines), by the
/// function whose dead-letter queue it came from.
pub(super) fn add_dead_letters_metric(resources: &mut Node, recorder: &Deployable) {
    let pattern = RECORDED_LINES
        .iter()
        .map(|line| format!("($.message = \"{line}\")"))
        .collect::<Vec<_>>()
        .join(" || ");
    add_metric_filter(
        resources,
        "DeadLettersMetricFilter",
        recorder,
        &format!("{{ {pattern} }}"),
        DEAD_LETTERS_METRIC,
        list![map! { "Key" => "function", "Value" => "$.function" }],
    );
}

/// An alarm on the new dead letters of catalog function `lambda`: any in a minute. A
/// deployment's signal, unlike its queue's depth alarm: the recorder drains a dead-letter queue
/// within seconds, so its depth shows a recorder that stopped, not a function that
/// dead-letters; this one is back to OK a minute after the last letter.
pub(super) fn add_new_dead_letters_alarm(resources: &mut Node, lambda: &Deployable) {
    let function = lambda.binary;
    resources.insert(
        &lambda.new_dead_letters_alarm_id(),
        alarm(
            &format!("{function} dead-lettered messages (recorded in the last minute): `paybus dead-letters groups`; during a deployment, the deployment rolls back"),
            sub(NAMESPACE),
            DEAD_LETTERS_METRIC,
            list![map! { "Name" => "function", "Value" => function }],
            "Sum",
            60,
            1,
        ),
    );
}

/// The metric filter on the auditor's violation lines and its alarm: any in a minute.
pub(super) fn add_audit_violations(resources: &mut Node, sweeper: &Deployable) {
    add_metric_filter(
        resources,
        "AuditViolationsMetricFilter",
        sweeper,
        &format!("{{ ($.level = \"ERROR\") && ($.message = \"{VIOLATION_LINE}\") }}"),
        AUDIT_VIOLATIONS_METRIC,
        list![],
    );
    resources.insert(
        AUDIT_VIOLATIONS_ALARM,
        alarm(
            "The continuous auditor found an invariant broken (its ERROR line `audit violation` names the check): GET /v1/admin/audit/findings; during a deployment, the deployment rolls back",
            sub(NAMESPACE),
            AUDIT_VIOLATIONS_METRIC,
            list![],
            "Sum",
            60,
            1,
        ),
    );
}

/// A metric filter counting the JSON lines of `lambda`'s log group that match `pattern`.
fn add_metric_filter(
    resources: &mut Node,
    id: &str,
    lambda: &Deployable,
    pattern: &str,
    metric: &str,
    dimensions: Node,
) {
    let transformation = map! {
        "MetricNamespace" => sub(NAMESPACE),
        "MetricName" => metric,
        "MetricValue" => "1",
        "Unit" => "Count",
        "Dimensions" => dimensions,
    }
    .without_empty_lists();
    resources.insert(
        id,
        map! {
            "Type" => "AWS::Logs::MetricFilter",
            "Properties" => map! {
                "LogGroupName" => reference(&lambda.log_group_id()),
                "FilterPattern" => pattern,
                "MetricTransformations" => list![transformation],
            },
        },
    );
}

pub(super) fn alarm(
    description: &str,
    namespace: impl Into<Node>,
    metric: &str,
    dimensions: Node,
    statistic: &str,
    period: i64,
    periods: i64,
) -> Node {
    let actions = map! { "Fn::If" => list!["HasAlarmTopic", list![reference("AlarmTopicArn")], reference("AWS::NoValue")] };
    map! {
        "Type" => "AWS::CloudWatch::Alarm",
        "Properties" => map! {
            "AlarmDescription" => description,
            "Namespace" => namespace.into(),
            "MetricName" => metric,
            "Dimensions" => dimensions,
            "Statistic" => statistic,
            "Period" => period,
            "EvaluationPeriods" => periods,
            "DatapointsToAlarm" => periods,
            "Threshold" => 0i64,
            "ComparisonOperator" => "GreaterThanThreshold",
            "TreatMissingData" => "notBreaching",
            "AlarmActions" => actions.clone(),
            "OKActions" => actions,
        }
        .without_empty_lists(),
    }
}
