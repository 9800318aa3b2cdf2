//! The AWS SAM template (`infra/aws/template.yaml`), generated from the catalog by
//! `paybus template`; a test keeps the shipped file equal to it and runs `cfn-lint` on it.
//!
//! One Lambda per catalog function on its Amazon MQ queue, the dead-letter recorder on every
//! dead-letter queue and `paybus.unrouted`, the sweeper on a schedule, the HTTP API behind an
//! API Gateway HTTP API, and the `migrate` function behind a custom resource that every other
//! function depends on. Secrets are references (`PAYBUS_*_FROM`, see
//! `paybus_config::secrets`), never values; alarms cover every dead-letter queue, every
//! function's errors and new dead letters, the auditor's violations and the API's 5xx answers.
//! Every Lambda but `migrate` is deployed gradually behind its alias, rolled back on its alarms.

use paybus_config::Shards;

use crate::{
    FUNCTIONS,
    yaml::{Node, map, reference, sub},
};

mod alarms;
mod deployments;
mod functions;
mod needs;
mod parameters;
mod policies;

use deployments::deploys_gradually;
pub use deployments::{
    ALIAS, ALL_AT_ONCE, DEFAULT_DEPLOYMENT_TYPE, DEPLOYMENT_TYPE, DEPLOYS_GRADUALLY,
};
use functions::{add_api, add_consumer, add_migration, add_recorder, add_sweeper, globals};
pub use needs::*;
use parameters::parameters;
use policies::conditions;
pub use policies::{MQ_TRIGGER_EC2_ACTIONS, SECRETS_KMS_KEYS};

/// Where the template lives, relative to the repository.
pub const TEMPLATE_PATH: &str = "infra/aws/template.yaml";

/// The longest `FunctionTimeout`: AWS asks Amazon MQ-triggered functions to stay at or under
/// 14 minutes, else the mapping may hand the batch out again while the first run goes on.
pub const MAX_FUNCTION_TIMEOUT_S: i64 = 840;

/// `migrate`'s own timeout: the longest a deploy's migrations may run.
pub const MIGRATE_TIMEOUT_S: i64 = 600;

/// How long CloudFormation waits for the migration's answer before it fails the resource
/// (CloudFormation's default is an hour, and an hour again on the rollback): `migrate`'s
/// timeout and a minute for the answer. It matters when migrate cannot reach the response
/// URL (no route to S3).
pub const MIGRATION_SERVICE_TIMEOUT_S: i64 = MIGRATE_TIMEOUT_S + 60;

/// A Lambda of the template: its binary (built from `crate_dir`, relative to the repository)
/// and its logical id's stem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployable {
    pub binary: &'static str,
    pub crate_dir: String,
    pub logical_id: String,
}

impl Deployable {
    fn new(binary: &'static str, crate_dir: &str) -> Self {
        Self {
            binary,
            crate_dir: crate_dir.to_owned(),
            logical_id: pascal_case(binary),
        }
    }

    fn function_id(&self) -> String {
        format!("{}Function", self.logical_id)
    }

    fn log_group_id(&self) -> String {
        format!("{}LogGroup", self.logical_id)
    }

    fn errors_alarm_id(&self) -> String {
        format!("{}ErrorsAlarm", self.logical_id)
    }

    fn new_dead_letters_alarm_id(&self) -> String {
        format!("{}NewDeadLettersAlarm", self.logical_id)
    }
}

/// Every Lambda the template deploys: the catalog's functions, then the platform's own.
pub fn deployables() -> Vec<Deployable> {
    let mut all: Vec<Deployable> = FUNCTIONS
        .iter()
        .map(|f| Deployable::new(f.name, &format!("functions/{}", f.name)))
        .collect();
    all.extend([
        Deployable::new("dead-letters", "functions/dead-letters"),
        Deployable::new("sweeper", "functions/sweeper"),
        Deployable::new("api", "api"),
        Deployable::new("migrate", "functions/migrate"),
    ]);
    all
}

/// `confirm-withdrawal` → `ConfirmWithdrawal`.
pub fn pascal_case(name: &str) -> String {
    name.split(['-', '_', '.'])
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The template as YAML text (what `paybus template` prints), every function unsharded: the
/// shipped `template.yaml`.
pub fn template_yaml() -> String {
    template_yaml_with(&Shards::default())
}

/// The template for the layout `shards` (`PAYBUS_SHARDS=… paybus template`).
pub fn template_yaml_with(shards: &Shards) -> String {
    let layout = if shards.is_empty() {
        String::new()
    } else {
        format!("# Shard layout: PAYBUS_SHARDS={shards}\n")
    };
    format!(
        "# Generated from the function catalog by `paybus template > {TEMPLATE_PATH}`: do not\n\
         # edit by hand (a test compares this file with the catalog). infra/aws/README.md\n\
         # explains every parameter, `sam build`, `sam deploy --guided` and rollback.\n{layout}{}",
        template_with(shards).to_yaml()
    )
}

/// The template as a document, every function unsharded.
pub fn template() -> Node {
    template_with(&Shards::default())
}

/// The template as a document for the layout `shards`: one trigger per shard of a sharded
/// function (Amazon MQ gives each trigger one execution environment), the layout in every
/// function's `PAYBUS_SHARDS` (the consumers read only their own queues, `migrate` declares
/// them).
pub fn template_with(shards: &Shards) -> Node {
    let mut resources = map! {};
    for function in FUNCTIONS {
        add_consumer(&mut resources, shards, function);
    }
    add_recorder(&mut resources);
    add_sweeper(&mut resources);
    add_api(&mut resources);
    add_migration(&mut resources, shards);
    let outputs = outputs(&deployables());
    let mut conditions = conditions();
    conditions.insert(DEPLOYS_GRADUALLY, deploys_gradually());

    map! {
        "AWSTemplateFormatVersion" => "2010-09-09",
        "Transform" => "AWS::Serverless-2016-10-31",
        "Description" => "paybus: one Lambda per function on Amazon MQ for RabbitMQ, the dead-letter recorder, the sweeper, the HTTP API and the migrations (generated from the function catalog)",
        "Parameters" => parameters(),
        "Conditions" => conditions,
        "Globals" => globals(shards),
        "Resources" => resources,
        "Outputs" => outputs,
    }
}

/// The stack's outputs: the API's URL and every function's name.
fn outputs(all: &[Deployable]) -> Node {
    let mut outputs = map! {
        "ApiUrl" => map! {
            "Description" => "The HTTP API's base URL",
            "Value" => sub("https://${HttpApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}/"),
        },
    };
    for lambda in all {
        outputs.insert(
            &format!("{}FunctionName", lambda.logical_id),
            map! { "Value" => reference(&lambda.function_id()) },
        );
    }

    outputs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_logical_ids() {
        assert_eq!(pascal_case("confirm-withdrawal"), "ConfirmWithdrawal");
        assert_eq!(pascal_case("api"), "Api");
        assert_eq!(pascal_case("dead-letters"), "DeadLetters");
    }

    #[test]
    fn what_a_function_declares_it_is_given() {
        let mut missing = Vec::new();
        for function in FUNCTIONS {
            let needs = needs(function.name);
            for secret in function.secrets {
                if !needs.secrets.iter().any(|s| s.variable == secret.name) {
                    missing.push(format!("{}: secret {}", function.name, secret.name));
                }
            }
            for setting in function.deployed_settings {
                if !needs.settings.iter().any(|s| s.variable == setting.name) {
                    missing.push(format!("{}: setting {}", function.name, setting.name));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "declared on the Function impl without a template parameter: {missing:?}"
        );
        let declared: usize = FUNCTIONS
            .iter()
            .map(|f| f.secrets.len() + f.deployed_settings.len())
            .sum();
        assert!(declared >= 3, "only {declared} needs declared");
    }
}
