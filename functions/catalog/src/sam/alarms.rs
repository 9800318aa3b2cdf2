//! Each Lambda's log group and alarms: its errors, every dead-letter queue.

use super::Deployable;
use crate::yaml::{Node, list, map, reference, sub};

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
        &format!("{}ErrorsAlarm", lambda.logical_id),
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

pub(super) fn alarm(
    description: &str,
    namespace: &str,
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
            "Namespace" => namespace,
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
        },
    }
}
