//! What a Lambda may do: its IAM policy (read exactly its secrets, the Amazon MQ trigger's
//! actions) and the conditions that tell a secret's ARN from an SSM parameter.

use super::needs::{SECRETS, SecretSetting};
use crate::yaml::{Node, list, map, reference, sub};

pub(super) fn conditions() -> Node {
    let mut conditions = map! {
        "HasAlarmTopic" => map! { "Fn::Not" => list![map! { "Fn::Equals" => list![reference("AlarmTopicArn"), ""] }] },
        HAS_SECRETS_KMS_KEYS => map! { "Fn::Not" => list![map! { "Fn::Equals" => list![
            map! { "Fn::Join" => list!["", reference(SECRETS_KMS_KEYS)] },
            "",
        ] }] },
    };
    for secret in SECRETS {
        reference_conditions(&mut conditions, secret);
    }
    conditions
}

/// The Lambda's own policy (least privilege): read each of `secrets` in whatever form its
/// reference takes, decrypt them when they are under customer-managed KMS keys, and, for an
/// Amazon MQ-triggered function, what the event source mapping needs of EC2 (SAM adds
/// `mq:DescribeBroker`, the broker credentials' secret and, through
/// `AWSLambdaVPCAccessExecutionRole`, only part of the EC2 actions).
pub(super) fn policy(secrets: &[SecretSetting], mq_triggered: bool) -> Node {
    let mut statements: Vec<Node> = secrets.iter().map(read_statement).collect();
    statements.push(map! { "Fn::If" => list![
        HAS_SECRETS_KMS_KEYS,
        map! {
            "Effect" => "Allow",
            "Action" => list!["kms:Decrypt"],
            "Resource" => reference(SECRETS_KMS_KEYS),
            "Condition" => map! { "StringEquals" => map! { "kms:ViaService" => list![
                sub("secretsmanager.${AWS::Region}.amazonaws.com"),
                sub("ssm.${AWS::Region}.amazonaws.com"),
            ] } },
        },
        reference("AWS::NoValue"),
    ] });
    if mq_triggered {
        statements.push(map! {
            "Effect" => "Allow",
            "Action" => Node::List(MQ_TRIGGER_EC2_ACTIONS.iter().map(|a| Node::from(*a)).collect()),
            "Resource" => "*",
        });
    }
    map! { "Version" => "2012-10-17", "Statement" => Node::List(statements) }
}

/// What Lambda's Amazon MQ event source needs of EC2 on the function's role (AWS Lambda
/// Developer Guide, "Using Lambda with Amazon MQ", execution role permissions): without
/// `DescribeSecurityGroups` and `DescribeVpcs` the trigger never enables.
pub const MQ_TRIGGER_EC2_ACTIONS: &[&str] = &[
    "ec2:CreateNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcs",
];

/// The parameter listing customer-managed KMS keys the secrets are encrypted with.
pub const SECRETS_KMS_KEYS: &str = "SecretsKmsKeyArns";
pub(super) const HAS_SECRETS_KMS_KEYS: &str = "HasSecretsKmsKeys";

/// `secret`'s reference without its `#key`: the secret or parameter itself.
pub(super) fn reference_id(secret: &SecretSetting) -> Node {
    map! { "Fn::Select" => list![0i64, map! { "Fn::Split" => list!["#", reference(secret.parameter)] }] }
}

pub(super) fn is_arn_condition(secret: &SecretSetting) -> String {
    format!("{}IsArn", secret.parameter)
}

pub(super) fn is_parameter_condition(secret: &SecretSetting) -> String {
    format!("{}IsParameter", secret.parameter)
}

/// The conditions that tell the forms of `secret`'s reference apart at deploy time (the
/// value is a parameter), as `paybus_config::secrets::Reference::parse` does at start-up:
/// an ARN starts with `arn:`; an SSM parameter is a `/path` or an ARN whose service is `ssm`.
pub(super) fn reference_conditions(conditions: &mut Node, secret: &SecretSetting) {
    let id = reference_id(secret);
    conditions.insert(
        &is_arn_condition(secret),
        map! { "Fn::Equals" => list![
            map! { "Fn::Select" => list![0i64, map! { "Fn::Split" => list![":", id.clone()] }] },
            "arn",
        ] },
    );
    // Padded with `::` so that the third field exists whatever the form (an out-of-range
    // Fn::Select fails the whole stack).
    let padded = map! { "Fn::Join" => list!["", list![id.clone(), "::"]] };
    conditions.insert(
        &is_parameter_condition(secret),
        map! { "Fn::Or" => list![
            map! { "Fn::Equals" => list![
                map! { "Fn::Select" => list![0i64, map! { "Fn::Split" => list!["/", id]}] },
                "",
            ] },
            map! { "Fn::Equals" => list![
                map! { "Fn::Select" => list![2i64, map! { "Fn::Split" => list![":", padded] }] },
                "ssm",
            ] },
        ] },
    );
}

/// The right to read `secret` whatever the form of its reference: `ssm:GetParameter` on the
/// parameter (its ARN, or the ARN of its `/path`), else `secretsmanager:GetSecretValue` on
/// the secret (its ARN, or for a name the ARN pattern `<name>-??????`: Secrets Manager adds
/// six random characters to every secret's ARN). A `#key` is never part of the resource.
pub(super) fn read_statement(secret: &SecretSetting) -> Node {
    let id = reference_id(secret);
    let arn_or = |pattern: &str| {
        map! { "Fn::If" => list![
            is_arn_condition(secret),
            id.clone(),
            map! { "Fn::Sub" => list![pattern, map! { "Id" => id.clone() }] },
        ] }
    };
    map! { "Fn::If" => list![
        is_parameter_condition(secret),
        map! {
            "Effect" => "Allow",
            "Action" => list!["ssm:GetParameter"],
            "Resource" => arn_or("arn:${AWS::Partition}:ssm:${AWS::Region}:${AWS::AccountId}:parameter${Id}"),
        },
        map! {
            "Effect" => "Allow",
            "Action" => list!["secretsmanager:GetSecretValue"],
            "Resource" => arn_or("arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:${Id}-??????"),
        },
    ] }
}
