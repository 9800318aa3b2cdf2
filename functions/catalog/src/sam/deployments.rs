//! Gradual deployments: every Lambda that takes traffic is published under the alias `live`,
//! which its triggers invoke, and CodeDeploy moves the alias to a new version as
//! `DeploymentType` says (10 % for 5 minutes by default), back to the old one when an alarm of
//! the function's fires meanwhile.

use crate::yaml::{Node, list, map, reference};

/// The alias every published Lambda's triggers invoke (SAM's `AutoPublishAlias`).
pub const ALIAS: &str = "live";

/// The parameter that chooses how the alias moves to a new version.
pub const DEPLOYMENT_TYPE: &str = "DeploymentType";

/// The gradual default: a tenth of the traffic for 5 minutes, then all of it.
pub const DEFAULT_DEPLOYMENT_TYPE: &str = "Canary10Percent5Minutes";

/// Every move into one step, and no alarm watching it.
pub const ALL_AT_ONCE: &str = "AllAtOnce";

/// CodeDeploy's predefined configurations for Lambda (`CodeDeployDefault.Lambda<name>`).
const DEPLOYMENT_TYPES: &[&str] = &[
    DEFAULT_DEPLOYMENT_TYPE,
    "Canary10Percent10Minutes",
    "Canary10Percent15Minutes",
    "Canary10Percent30Minutes",
    "Linear10PercentEvery1Minute",
    "Linear10PercentEvery2Minutes",
    "Linear10PercentEvery3Minutes",
    "Linear10PercentEvery10Minutes",
    ALL_AT_ONCE,
];

/// True unless `DeploymentType` is `AllAtOnce`.
pub const DEPLOYS_GRADUALLY: &str = "DeploysGradually";

pub(super) fn deployment_type_parameter() -> Node {
    map! {
        "Type" => "String",
        "Description" => "How CodeDeploy moves each function's alias to a new version: gradually, rolled back when one of the function's alarms fires (the default), or AllAtOnce in one step with no alarm watching (a fix while an alarm is firing). A stack's first deployment creates the aliases on the first versions whatever the type",
        "Default" => DEFAULT_DEPLOYMENT_TYPE,
        "AllowedValues" => Node::List(DEPLOYMENT_TYPES.iter().map(|t| Node::from(*t)).collect()),
    }
}

pub(super) fn deploys_gradually() -> Node {
    map! { "Fn::Not" => list![map! { "Fn::Equals" => list![reference(DEPLOYMENT_TYPE), ALL_AT_ONCE] }] }
}

/// Publishes the Lambda under [`ALIAS`] and deploys it gradually, watched by `alarms` (their
/// names: a `Ref` to an alarm, or the name an alarm was given). An alarm already firing when a
/// deployment starts stops it: `AllAtOnce` drops them, so a fix can still go out during the
/// incident it fixes.
pub(super) fn deploy_gradually(properties: &mut Node, alarms: Vec<Node>) {
    properties.insert("AutoPublishAlias", ALIAS);
    let watched = Node::List(alarms);
    properties.insert(
        "DeploymentPreference",
        map! {
            "Type" => reference(DEPLOYMENT_TYPE),
            "Alarms" => map! { "Fn::If" => list![
                DEPLOYS_GRADUALLY,
                watched,
                // SAM takes a list here; AWS::NoValue alone is refused.
                list![reference("AWS::NoValue")],
            ] },
        },
    );
}
