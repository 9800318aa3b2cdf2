//! The template as AWS would deploy it: translated offline by AWS SAM's own translator
//! (`infra/aws/translate.py`, installed with cfn-lint by `infra/aws/tools.sh lint`), then read
//! as the CloudFormation it is. What a first deployment needs is asserted on that output, not
//! on our own YAML: the Amazon MQ triggers' EC2 and MQ permissions, a policy on the right ARN
//! with the right action for every form a secret reference may take, the migration's
//! `ServiceTimeout`, no timeout past 14 minutes, every trigger on the alias CodeDeploy moves,
//! watched by the function's alarms unless the deployment is `AllAtOnce`.
//!
//! A reference's form is only known at deploy time (it is a parameter), so the template
//! chooses with conditions; [`Deploy`] resolves the translated template's intrinsic functions
//! for given parameter values, as CloudFormation does when it creates the stack, so each form
//! is checked on the policies it really yields.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_testkit::repository;
use std::{collections::BTreeMap, path::Path, process::Command};

use paybus_catalog::sam::{self, TEMPLATE_PATH};
use paybus_config::secrets::{Reference, Store};
use serde_json::{Value, json};

/// The venv's python (where `infra/aws/tools.sh lint` installs the translator), else one on
/// `PATH`.
fn python() -> std::path::PathBuf {
    let venv = repository().join(".local/aws-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// `template` (a file, YAML or JSON) as AWS SAM's translator turns it into CloudFormation.
fn translate_file(template: &Path) -> Value {
    let output = Command::new(python())
        .arg(repository().join("infra/aws/translate.py"))
        .arg(template)
        .output()
        .unwrap_or_else(|e| panic!("cannot run infra/aws/translate.py ({e}): install the translator with infra/aws/tools.sh lint"));
    assert!(
        output.status.success(),
        "the SAM translator refused {}:\n{}",
        template.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn translate(template: &Value) -> Value {
    let path = std::env::temp_dir().join(format!(
        "paybus-translate-{}-{}.json",
        std::process::id(),
        uuid_like()
    ));
    std::fs::write(&path, serde_json::to_string(template).unwrap()).unwrap();
    let translated = translate_file(&path);
    let _ = std::fs::remove_file(&path);
    translated
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn shipped() -> Value {
    translate_file(&repository().join(TEMPLATE_PATH))
}

const REGION: &str = "eu-central-1";
const ACCOUNT: &str = "123456789012";

/// A stack created from the translated template with these parameter values: its intrinsic
/// functions resolved as CloudFormation resolves them (`Ref`, `Fn::Sub`, `Fn::Select`,
/// `Fn::Split`, `Fn::Join`, `Fn::If` and the condition functions; `AWS::NoValue` removes what
/// it stands for). A resource's `Ref` or attribute stays a placeholder (`<Id>`, `<Id.Attr>`).
struct Deploy<'t> {
    template: &'t Value,
    parameters: BTreeMap<String, Value>,
}

impl<'t> Deploy<'t> {
    /// Every parameter at its default, `values` over them; a parameter without a default must
    /// be given (as CloudFormation insists).
    fn new(template: &'t Value, values: &[(&str, &str)]) -> Self {
        let mut parameters = BTreeMap::new();
        for (name, parameter) in template["Parameters"].as_object().unwrap() {
            let given = values.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
            let text = given
                .map(str::to_owned)
                .or_else(|| parameter.get("Default").map(scalar_text))
                .unwrap_or_else(|| panic!("parameter {name} needs a value"));
            let value = if parameter["Type"] == "CommaDelimitedList"
                || parameter["Type"].as_str().unwrap().starts_with("List<")
            {
                Value::Array(text.split(',').map(|s| Value::from(s.trim())).collect())
            } else {
                Value::from(text)
            };
            parameters.insert(name.clone(), value);
        }
        Self {
            template,
            parameters,
        }
    }

    fn condition(&self, name: &str) -> bool {
        let definition = &self.template["Conditions"][name];
        assert!(!definition.is_null(), "no condition {name}");
        self.resolve(definition).unwrap().as_bool().unwrap()
    }

    /// `value` resolved; `None` for `AWS::NoValue`.
    fn resolve(&self, value: &Value) -> Option<Value> {
        match value {
            Value::Array(items) => Some(Value::Array(
                items.iter().filter_map(|i| self.resolve(i)).collect(),
            )),
            Value::Object(map) if map.len() == 1 => {
                let (key, argument) = map.iter().next().unwrap();
                self.function(key, argument).unwrap_or_else(|| {
                    let resolved = self.resolve(argument)?;
                    Some(json!({ key: resolved }))
                })
            }
            Value::Object(map) => Some(Value::Object(
                map.iter()
                    .filter_map(|(k, v)| Some((k.clone(), self.resolve(v)?)))
                    .collect(),
            )),
            scalar => Some(scalar.clone()),
        }
    }

    /// An intrinsic function's value (`Some(None)` is `AWS::NoValue`); `None` when `key` is not
    /// one.
    fn function(&self, key: &str, argument: &Value) -> Option<Option<Value>> {
        let text = |v: &Value| -> String {
            self.resolve(v)
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| panic!("not a string: {v}"))
        };
        let list = |v: &Value| -> Vec<Value> {
            match self.resolve(v) {
                Some(Value::Array(items)) => items,
                other => panic!("not a list: {other:?}"),
            }
        };
        let args = || argument.as_array().unwrap();
        let value = match key {
            "Ref" => return Some(self.reference(argument.as_str().unwrap())),
            "Condition" => Value::Bool(self.condition(argument.as_str().unwrap())),
            "Fn::GetAtt" => {
                let parts: Vec<String> = args().iter().map(scalar_text).collect();
                Value::from(format!("<{}>", parts.join(".")))
            }
            "Fn::Sub" => {
                let (pattern, variables) = match argument {
                    Value::String(pattern) => (pattern.clone(), serde_json::Map::new()),
                    _ => (
                        args()[0].as_str().unwrap().to_owned(),
                        args()[1].as_object().unwrap().clone(),
                    ),
                };
                Value::from(self.substitute(&pattern, &variables))
            }
            "Fn::Select" => {
                let index: usize = scalar_text(&args()[0]).parse().unwrap();
                let items = list(&args()[1]);
                // CloudFormation fails the stack here: so does the test.
                items
                    .get(index)
                    .unwrap_or_else(|| panic!("Fn::Select {index} out of {items:?}"))
                    .clone()
            }
            "Fn::Split" => {
                let delimiter = text(&args()[0]);
                Value::Array(
                    text(&args()[1])
                        .split(delimiter.as_str())
                        .map(Value::from)
                        .collect(),
                )
            }
            "Fn::Join" => {
                let delimiter = text(&args()[0]);
                let parts: Vec<String> = list(&args()[1]).iter().map(scalar_text).collect();
                Value::from(parts.join(&delimiter))
            }
            "Fn::If" => {
                let chosen = if self.condition(args()[0].as_str().unwrap()) {
                    &args()[1]
                } else {
                    &args()[2]
                };
                return Some(self.resolve(chosen));
            }
            "Fn::Equals" => Value::Bool(self.resolve(&args()[0]) == self.resolve(&args()[1])),
            "Fn::Not" => Value::Bool(!self.resolve(&args()[0]).unwrap().as_bool().unwrap()),
            "Fn::Or" => Value::Bool(
                args()
                    .iter()
                    .any(|c| self.resolve(c).unwrap().as_bool().unwrap()),
            ),
            "Fn::And" => Value::Bool(
                args()
                    .iter()
                    .all(|c| self.resolve(c).unwrap().as_bool().unwrap()),
            ),
            _ => return None,
        };
        Some(Some(value))
    }

    fn reference(&self, name: &str) -> Option<Value> {
        match name {
            "AWS::NoValue" => None,
            "AWS::Partition" => Some("aws".into()),
            "AWS::Region" => Some(REGION.into()),
            "AWS::AccountId" => Some(ACCOUNT.into()),
            "AWS::StackName" => Some("paybus".into()),
            "AWS::URLSuffix" => Some("amazonaws.com".into()),
            _ => Some(
                self.parameters
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| Value::from(format!("<{name}>"))),
            ),
        }
    }

    fn substitute(&self, pattern: &str, variables: &serde_json::Map<String, Value>) -> String {
        let mut out = String::new();
        let mut rest = pattern;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..].find('}').unwrap() + start;
            let name = &rest[start + 2..end];
            if let Some(literal) = name.strip_prefix('!') {
                out.push_str(&format!("${{{literal}}}"));
            } else if let Some(value) = variables.get(name) {
                out.push_str(&scalar_text(&self.resolve(value).unwrap()));
            } else if name.contains('.') {
                out.push_str(&format!("<{name}>"));
            } else {
                out.push_str(&scalar_text(&self.reference(name).unwrap()));
            }
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// Every statement of the IAM role of Lambda `function` (its inline policies), resolved.
    fn statements(&self, function: &str) -> Vec<Value> {
        let role = role_of(self.template, function);
        self.resolve(&self.template["Resources"][&role]["Properties"]["Policies"])
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|policy| {
                policy["PolicyDocument"]["Statement"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .collect()
    }

    /// The statements of `function`'s role allowing `action`.
    fn allowing(&self, function: &str, action: &str) -> Vec<Value> {
        self.statements(function)
            .into_iter()
            .filter(|s| s["Effect"] == "Allow" && as_list(&s["Action"]).contains(&json!(action)))
            .collect()
    }

    /// The resources `function`'s role may use `action` on.
    fn resources(&self, function: &str, action: &str) -> Vec<String> {
        self.allowing(function, action)
            .iter()
            .flat_map(|s| as_list(&s["Resource"]))
            .map(|r| scalar_text(&r))
            .collect()
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn as_list(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        single => vec![single.clone()],
    }
}

/// The logical id of Lambda `function`'s role (`Role: {Fn::GetAtt: [<role>, Arn]}`).
fn role_of(template: &Value, function: &str) -> String {
    template["Resources"][function]["Properties"]["Role"]["Fn::GetAtt"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{function} has no role of the stack's"))
        .to_owned()
}

fn resources_of_type<'a>(template: &'a Value, kind: &str) -> Vec<(&'a String, &'a Value)> {
    template["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == kind)
        .collect()
}

/// The function resource behind `id`: itself, or the function an alias of it names.
fn function_behind(template: &Value, id: &str) -> String {
    let resource = &template["Resources"][id];
    if resource["Type"] == "AWS::Lambda::Alias" {
        resource["Properties"]["FunctionName"]["Ref"]
            .as_str()
            .unwrap()
            .to_owned()
    } else {
        id.to_owned()
    }
}

/// The Lambdas an Amazon MQ event source mapping invokes (through their alias), with their
/// queues.
fn mq_triggered(template: &Value) -> BTreeMap<String, Vec<String>> {
    let mut functions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, mapping) in resources_of_type(template, "AWS::Lambda::EventSourceMapping") {
        let properties = &mapping["Properties"];
        let Some(queues) = properties["Queues"].as_array() else {
            continue;
        };
        let function = function_behind(
            template,
            properties["FunctionName"]["Ref"].as_str().unwrap(),
        );
        functions
            .entry(function)
            .or_default()
            .extend(queues.iter().map(scalar_text));
    }
    functions
}

/// What the Lambda Developer Guide lists for an Amazon MQ event source's execution role
/// ("Using Lambda with Amazon MQ", execution role permissions), written out here rather than
/// taken from the template's code.
const MQ_EC2_ACTIONS: [&str; 6] = [
    "ec2:CreateNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:DescribeVpcs",
];

/// Parameter values a deploy must give (no default), each a plain Secrets Manager ARN.
fn required_values() -> Vec<(String, String)> {
    let mut values: Vec<(String, String)> = sam::SECRETS
        .iter()
        .map(|s| {
            (
                s.parameter.to_owned(),
                secret_arn(&format!("paybus/{}", s.parameter)),
            )
        })
        .collect();
    values.extend([
        (
            "BrokerArn".to_owned(),
            format!("arn:aws:mq:{REGION}:{ACCOUNT}:broker:paybus:b-1234"),
        ),
        (
            "BrokerCredentialsSecretArn".to_owned(),
            secret_arn("paybus/broker-credentials"),
        ),
        (
            "SecretsExtensionLayerArn".to_owned(),
            format!("arn:aws:lambda:{REGION}:187925254637:layer:AWS-Parameters-and-Secrets-Lambda-Extension-Arm64:12"),
        ),
        ("SubnetIds".to_owned(), "subnet-1,subnet-2".to_owned()),
        ("SecurityGroupIds".to_owned(), "sg-1".to_owned()),
    ]);
    values
}

fn secret_arn(name: &str) -> String {
    format!("arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbCdEf")
}

fn deploy<'t>(template: &'t Value, overrides: &[(String, String)]) -> Deploy<'t> {
    let mut values = required_values();
    for (name, value) in overrides {
        values.retain(|(n, _)| n != name);
        values.push((name.clone(), value.clone()));
    }
    let values: Vec<(&str, &str)> = values
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    Deploy::new(template, &values)
}

/// What the MQ-triggered roles of `template` (translated) lack.
fn mq_trigger_problems(template: &Value) -> Vec<String> {
    let stack = deploy(template, &[]);
    let broker = stack.parameters["BrokerArn"].as_str().unwrap().to_owned();
    let credentials = stack.parameters["BrokerCredentialsSecretArn"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut problems = Vec::new();
    for function in mq_triggered(template).keys() {
        for action in MQ_EC2_ACTIONS {
            if stack.allowing(function, action).is_empty() {
                problems.push(format!("{function}: its role may not {action}"));
            }
        }
        if !stack
            .resources(function, "mq:DescribeBroker")
            .contains(&broker)
        {
            problems.push(format!(
                "{function}: its role may not mq:DescribeBroker the broker"
            ));
        }
        if !stack
            .resources(function, "secretsmanager:GetSecretValue")
            .contains(&credentials)
        {
            problems.push(format!(
                "{function}: its role may not read the broker credentials"
            ));
        }
    }
    problems
}

#[test]
fn every_mq_triggered_role_has_the_ec2_and_mq_actions_the_trigger_needs() {
    let template = shipped();
    let triggered = mq_triggered(&template);

    // Every catalog function and the recorder: a scan that found none would pass for nothing.
    assert_eq!(
        triggered.len(),
        paybus_catalog::FUNCTIONS.len() + 1,
        "{triggered:?}"
    );
    assert_eq!(mq_trigger_problems(&template), Vec::<String>::new());
}

#[test]
fn a_role_without_the_trigger_actions_is_caught() {
    // The control: the template as it was before, with no EC2 statement of its own (SAM's
    // AWSLambdaVPCAccessExecutionRole lacks DescribeSecurityGroups and DescribeVpcs).
    let mut template = sam::template().to_json();
    for (_, resource) in template["Resources"].as_object_mut().unwrap().iter_mut() {
        let policies = resource
            .get_mut("Properties")
            .and_then(|p| p.get_mut("Policies"))
            .and_then(Value::as_array_mut);
        if let Some(policies) = policies {
            for policy in policies {
                if let Some(statements) = policy["Statement"].as_array_mut() {
                    statements.retain(|s| s["Resource"] != "*");
                }
            }
        }
    }

    let problems = mq_trigger_problems(&translate(&template));

    assert!(
        problems
            .iter()
            .any(|p| p == "ConfirmWithdrawalFunction: its role may not ec2:DescribeVpcs"),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p == "DeadLettersFunction: its role may not ec2:DescribeSecurityGroups"),
        "{problems:?}"
    );
}

/// A form of reference for the secret `name`, and what its Lambda must then be allowed.
struct Form {
    what: &'static str,
    reference: fn(&str) -> String,
    action: &'static str,
    resource: fn(&str) -> String,
}

const FORMS: &[Form] = &[
    Form {
        what: "a secret's ARN",
        reference: |name| secret_arn(name),
        action: "secretsmanager:GetSecretValue",
        resource: |name| secret_arn(name),
    },
    Form {
        what: "a key of a JSON secret by ARN",
        reference: |name| format!("{}#url", secret_arn(name)),
        action: "secretsmanager:GetSecretValue",
        resource: |name| secret_arn(name),
    },
    Form {
        what: "a secret's name",
        reference: |name| name.to_owned(),
        action: "secretsmanager:GetSecretValue",
        resource: |name| format!("arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-??????"),
    },
    Form {
        what: "a key of a JSON secret by name",
        reference: |name| format!("{name}#url"),
        action: "secretsmanager:GetSecretValue",
        resource: |name| format!("arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-??????"),
    },
    Form {
        what: "an SSM parameter's path",
        reference: |name| format!("/{name}"),
        action: "ssm:GetParameter",
        resource: |name| format!("arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{name}"),
    },
    Form {
        what: "an SSM parameter's ARN",
        reference: |name| format!("arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{name}"),
        action: "ssm:GetParameter",
        resource: |name| format!("arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{name}"),
    },
];

/// The secret parameters `function` gets a reference to (`<X>_FROM: {Ref: <parameter>}`, its
/// own or the globals').
fn references_of(template: &Value, function: &str) -> Vec<String> {
    let mut variables = template["Resources"][function]["Properties"]["Environment"]["Variables"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    if let Some(globals) = template["Globals"]["Function"]["Environment"]["Variables"].as_object() {
        variables.extend(globals.clone());
    }
    variables
        .iter()
        .filter(|(name, _)| name.ends_with("_FROM"))
        .filter_map(|(_, value)| value["Ref"].as_str().map(str::to_owned))
        .collect()
}

/// What the roles of `translated` get wrong when every secret reference takes `form` (each
/// parameter naming a secret of its own): a secret a Lambda reads but may not, with that
/// form's action on that form's ARN, and any other secret or parameter it may read.
fn reference_problems(translated: &Value, template: &Value, form: &Form) -> Vec<String> {
    let name = |parameter: &str| format!("paybus/{parameter}");
    let values: Vec<(String, String)> = sam::SECRETS
        .iter()
        .map(|s| (s.parameter.to_owned(), (form.reference)(&name(s.parameter))))
        .collect();
    let stack = deploy(translated, &values);
    let wrong = if form.action == "ssm:GetParameter" {
        "secretsmanager:GetSecretValue"
    } else {
        "ssm:GetParameter"
    };
    let mut problems = Vec::new();
    for lambda in &sam::deployables() {
        let function = format!("{}Function", lambda.logical_id);
        let read = references_of(template, &function);
        let granted = stack.resources(&function, form.action);
        let own: Vec<String> = read.iter().map(|p| (form.resource)(&name(p))).collect();
        for expected in &own {
            if !granted.contains(expected) {
                problems.push(format!(
                    "{}: {function} may not {} {expected}",
                    form.what, form.action
                ));
            }
        }
        // Nothing beyond what it reads (the broker credentials are the trigger's).
        let other_service = stack.resources(&function, wrong);
        let beyond = granted
            .iter()
            .filter(|r| !own.contains(r))
            .chain(&other_service)
            .filter(|r| !r.contains("broker-credentials"))
            .map(|r| format!("{}: {function} may also read {r}", form.what));
        problems.extend(beyond);
    }
    problems
}

#[test]
fn every_reference_form_yields_a_policy_on_its_own_arn_with_its_own_action() {
    let translated = shipped();
    let template = sam::template().to_json();
    let lambdas = resources_of_type(&translated, "AWS::Lambda::Function");
    assert_eq!(lambdas.len(), sam::deployables().len());
    for lambda in sam::deployables() {
        let function = format!("{}Function", lambda.logical_id);
        assert!(references_of(&template, &function).contains(&"DatabaseUrlSecretArn".to_owned()));
    }

    for form in FORMS {
        // The code reads the form the way the template grants it.
        let store = Reference::parse(&(form.reference)("paybus/x")).store;
        let expected = if form.action == "ssm:GetParameter" {
            Store::ParameterStore
        } else {
            Store::SecretsManager
        };
        assert_eq!(store, expected, "{}", form.what);

        assert_eq!(
            reference_problems(&translated, &template, form),
            Vec::<String>::new()
        );
    }
}

#[test]
fn a_policy_on_the_reference_itself_is_caught_for_every_form_but_a_plain_arn() {
    // The control: the template's policies as they were, SAM's
    // AWSSecretsManagerGetSecretValuePolicy with the reference as the secret's ARN.
    let mut template = sam::template().to_json();
    for lambda in sam::deployables() {
        let function = format!("{}Function", lambda.logical_id);
        let policies: Vec<Value> = references_of(&template, &function)
            .into_iter()
            .map(|p| json!({"AWSSecretsManagerGetSecretValuePolicy": {"SecretArn": {"Ref": p}}}))
            .collect();
        template["Resources"][&function]["Properties"]["Policies"] = Value::Array(policies);
    }
    let translated = translate(&template);

    let caught: Vec<&str> = FORMS
        .iter()
        .filter(|form| !reference_problems(&translated, &template, form).is_empty())
        .map(|form| form.what)
        .collect();

    assert_eq!(
        caught,
        [
            "a key of a JSON secret by ARN",
            "a secret's name",
            "a key of a JSON secret by name",
            "an SSM parameter's path",
            "an SSM parameter's ARN"
        ]
    );
}

#[test]
fn secrets_under_customer_managed_keys_may_be_decrypted_through_their_services_only() {
    let translated = shipped();
    let keys =
        format!("arn:aws:kms:{REGION}:{ACCOUNT}:key/1111,arn:aws:kms:{REGION}:{ACCOUNT}:key/2222");
    let with_keys = deploy(
        &translated,
        &[(sam::SECRETS_KMS_KEYS.to_owned(), keys.clone())],
    );
    let without = deploy(&translated, &[]);

    for lambda in sam::deployables() {
        let function = format!("{}Function", lambda.logical_id);
        let decrypt = with_keys.allowing(&function, "kms:Decrypt");
        assert_eq!(decrypt.len(), 1, "{function}: {decrypt:?}");
        let resources: Vec<String> = as_list(&decrypt[0]["Resource"])
            .iter()
            .map(scalar_text)
            .collect();
        assert_eq!(resources.join(","), keys, "{function}");
        assert_eq!(
            decrypt[0]["Condition"]["StringEquals"]["kms:ViaService"],
            json!([
                format!("secretsmanager.{REGION}.amazonaws.com"),
                format!("ssm.{REGION}.amazonaws.com")
            ]),
            "{function}"
        );
        assert!(
            without.allowing(&function, "kms:Decrypt").is_empty(),
            "{function}: no key, no kms:Decrypt"
        );
    }
}

#[test]
fn the_migration_has_a_service_timeout_longer_than_its_run() {
    let template = shipped();
    let migrations = resources_of_type(&template, "Custom::PaybusMigration");
    assert_eq!(migrations.len(), 1);
    let (_, migration) = migrations[0];
    let timeout = migration["Properties"]["ServiceTimeout"]
        .as_i64()
        .expect("the custom resource has a ServiceTimeout");
    let run = template["Resources"]["MigrateFunction"]["Properties"]["Timeout"]
        .as_i64()
        .unwrap();

    // CloudFormation accepts 1..=3600 s; past the Lambda's own timeout no answer can come.
    assert!((1..=3600).contains(&timeout), "{timeout}");
    assert!(
        timeout > run,
        "ServiceTimeout {timeout} s, migrate runs up to {run} s"
    );
}

#[test]
fn no_function_may_run_past_fourteen_minutes() {
    let template = shipped();

    for (id, function) in resources_of_type(&template, "AWS::Lambda::Function") {
        let timeout = &function["Properties"]["Timeout"];
        let longest = match timeout {
            Value::Number(n) => n.as_i64().unwrap(),
            _ => {
                let parameter = &template["Parameters"][timeout["Ref"].as_str().unwrap()];
                let default = parameter["Default"].as_i64().unwrap();
                let max = parameter["MaxValue"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("{id}: its timeout parameter has no MaxValue"));
                assert!(default <= max);
                max
            }
        };
        assert!(longest <= 840, "{id}: up to {longest} s");
    }
}

#[test]
fn a_four_shard_function_translates_into_four_mappings_whose_role_may_use_them() {
    let shards = paybus_config::Shards::default().with("confirm-withdrawal", 4);
    let translated = translate(&sam::template_with(&shards).to_json());

    let triggered = mq_triggered(&translated);
    assert_eq!(
        triggered["ConfirmWithdrawalFunction"],
        [
            "paybus.confirm-withdrawal.s0",
            "paybus.confirm-withdrawal.s1",
            "paybus.confirm-withdrawal.s2",
            "paybus.confirm-withdrawal.s3"
        ]
    );
    assert_eq!(mq_trigger_problems(&translated), Vec::<String>::new());
    let environment = &translated["Resources"]["ConfirmWithdrawalFunction"]["Properties"]["Environment"]
        ["Variables"];
    assert_eq!(environment["PAYBUS_SHARDS"], "confirm-withdrawal=4");
}

#[test]
fn a_cognito_user_pool_reaches_the_api_and_no_other_function() {
    let translated = shipped();
    let issuer = format!("https://cognito-idp.{REGION}.amazonaws.com/{REGION}_AbCdEfGhI");
    let cognito: Vec<(String, String)> = [
        ("OidcIssuer", issuer.as_str()),
        ("OidcAudience", "4e9abcdefgh1234567ijklmnop"),
        ("OidcAdminGroups", "payments-admins"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect();
    let stack = deploy(&translated, &cognito);
    let environment = |function: &str| {
        stack
            .resolve(&translated["Resources"][function]["Properties"]["Environment"]["Variables"])
            .unwrap()
    };

    let api = environment("ApiFunction");
    assert_eq!(api["PAYBUS_OIDC_ISSUER"], issuer.as_str());
    assert_eq!(api["PAYBUS_OIDC_AUDIENCE"], "4e9abcdefgh1234567ijklmnop");
    assert_eq!(
        api["PAYBUS_OIDC_ROLES_CLAIM"], "cognito:groups",
        "Cognito's claim by default"
    );
    assert_eq!(api["PAYBUS_OIDC_ADMIN_GROUPS"], "payments-admins");
    assert_eq!(api["PAYBUS_OIDC_OPS_GROUPS"], "paybus-ops");
    assert_eq!(api["PAYBUS_BREAK_GLASS"], "false", "off unless asked for");
    for lambda in sam::deployables() {
        let function = format!("{}Function", lambda.logical_id);
        if function == "ApiFunction" {
            continue;
        }
        let variables = environment(&function);
        assert!(
            sam::IDENTITY_SETTINGS
                .iter()
                .all(|setting| variables.get(setting.variable).is_none()),
            "{function}: {variables}"
        );
    }
}

/// What is wrong with the invoker `id` (an event source mapping, a rule's target, a
/// permission) invoking `target` (the resource it names): not the alias [`sam::ALIAS`] of a
/// function, or an alias CodeDeploy does not move.
fn alias_problems(template: &Value, id: &str, target: &str) -> Vec<String> {
    let alias = &template["Resources"][target];
    if alias["Type"] != "AWS::Lambda::Alias" || alias["Properties"]["Name"] != sam::ALIAS {
        return vec![format!(
            "{id} invokes {target}, not an alias {}",
            sam::ALIAS
        )];
    }
    let group = &alias["UpdatePolicy"]["CodeDeployLambdaAliasUpdate"]["DeploymentGroupName"]["Ref"];
    let deployed = group
        .as_str()
        .is_some_and(|g| template["Resources"][g]["Type"] == "AWS::CodeDeploy::DeploymentGroup");
    if deployed {
        Vec::new()
    } else {
        vec![format!(
            "{id} invokes {target}, which CodeDeploy does not move"
        )]
    }
}

/// Every invoker of every Lambda in `template` (translated) with the resource it invokes: the
/// event source mappings, the schedule's rules, the HTTP API's integration and the permissions.
fn invokers(template: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (id, mapping) in resources_of_type(template, "AWS::Lambda::EventSourceMapping") {
        found.push((
            id.clone(),
            scalar_text(&mapping["Properties"]["FunctionName"]["Ref"]),
        ));
    }
    for (id, rule) in resources_of_type(template, "AWS::Events::Rule") {
        for target in rule["Properties"]["Targets"].as_array().unwrap() {
            found.push((id.clone(), scalar_text(&target["Arn"]["Ref"])));
        }
    }
    for (id, permission) in resources_of_type(template, "AWS::Lambda::Permission") {
        found.push((
            id.clone(),
            scalar_text(&permission["Properties"]["FunctionName"]["Ref"]),
        ));
    }
    for (id, api) in resources_of_type(template, "AWS::ApiGatewayV2::Api") {
        let body = api["Properties"]["Body"].to_string();
        // The integration's URI: `…:lambda:path/2015-03-31/functions/${<target>}/invocations`.
        for part in body.split("/functions/${").skip(1) {
            found.push((id.clone(), part.split('}').next().unwrap().to_owned()));
        }
    }
    found
}

#[test]
fn every_trigger_invokes_the_alias_codedeploy_moves() {
    let translated = shipped();
    let found = invokers(&translated);

    let problems: Vec<String> = found
        .iter()
        .flat_map(|(id, target)| alias_problems(&translated, id, target))
        .collect();
    assert_eq!(problems, Vec::<String>::new());
    // Every trigger was seen: a mapping per catalog function and per dead-letter queue (and
    // paybus.unrouted), the schedule, the HTTP API.
    let mappings = resources_of_type(&translated, "AWS::Lambda::EventSourceMapping").len();
    assert_eq!(mappings, 2 * paybus_catalog::FUNCTIONS.len() + 1);
    let invoked: std::collections::BTreeSet<String> = found
        .iter()
        .map(|(_, target)| function_behind(&translated, target))
        .collect();
    let expected: std::collections::BTreeSet<String> = sam::deployables()
        .iter()
        .filter(|lambda| lambda.binary != "migrate")
        .map(|lambda| format!("{}Function", lambda.logical_id))
        .collect();
    assert_eq!(invoked, expected);
}

#[test]
fn a_trigger_on_the_function_itself_is_caught() {
    // The control: the template as it was before, no alias on the first catalog function.
    let mut template = sam::template().to_json();
    let id = format!(
        "{}Function",
        sam::pascal_case(paybus_catalog::FUNCTIONS[0].name)
    );
    let properties = template["Resources"][&id]["Properties"]
        .as_object_mut()
        .unwrap();
    properties.remove("AutoPublishAlias");
    properties.remove("DeploymentPreference");
    let translated = translate(&template);

    let problems: Vec<String> = invokers(&translated)
        .iter()
        .flat_map(|(invoker, target)| alias_problems(&translated, invoker, target))
        .collect();

    assert_eq!(
        problems,
        [format!("{id}Queue invokes {id}, not an alias live")]
    );
}

/// The alarms each deployment group of `stack` stops and rolls back on, by the function whose
/// alias it moves.
fn deployment_alarms(translated: &Value, stack: &Deploy) -> BTreeMap<String, Vec<String>> {
    let mut watched = BTreeMap::new();
    for (alias_id, alias) in resources_of_type(translated, "AWS::Lambda::Alias") {
        let Some(group) =
            alias["UpdatePolicy"]["CodeDeployLambdaAliasUpdate"]["DeploymentGroupName"]["Ref"]
                .as_str()
        else {
            continue;
        };
        let properties = &translated["Resources"][group]["Properties"];
        let rollback = &properties["AutoRollbackConfiguration"];
        assert_eq!(rollback["Enabled"], true, "{group}");
        assert!(
            as_list(&rollback["Events"]).contains(&json!("DEPLOYMENT_STOP_ON_ALARM")),
            "{group}"
        );
        let alarms = stack
            .resolve(&properties["AlarmConfiguration"])
            .unwrap_or(Value::Null);
        let names = if alarms["Enabled"] == true {
            as_list(&alarms["Alarms"])
                .iter()
                .map(|a| scalar_text(&a["Name"]))
                .collect()
        } else {
            Vec::new()
        };
        watched.insert(function_behind(translated, alias_id), names);
    }
    watched
}

#[test]
fn deployments_are_watched_by_their_alarms_unless_all_at_once() {
    let translated = shipped();
    let template = sam::template().to_json();

    let stack = deploy(&translated, &[]);
    let gradual = deployment_alarms(&translated, &stack);
    for (function, alarms) in &gradual {
        let declared: Vec<String> = template["Resources"][function]["Properties"]
            ["DeploymentPreference"]["Alarms"]["Fn::If"][1]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| scalar_text(&stack.resolve(a).unwrap()))
            .collect();
        assert!(!declared.is_empty(), "{function}");
        assert_eq!(alarms, &declared, "{function}");
    }
    assert_eq!(gradual.len(), sam::deployables().len() - 1, "{gradual:?}");
    // The type was the parameter's default when the transform ran (CloudFormation's transform
    // reads the stack's parameter values the same way).
    for (_, group) in resources_of_type(&translated, "AWS::CodeDeploy::DeploymentGroup") {
        let config = stack.resolve(&group["Properties"]["DeploymentConfigName"]);
        assert_eq!(
            config,
            Some(json!(format!(
                "CodeDeployDefault.Lambda{}",
                sam::DEFAULT_DEPLOYMENT_TYPE
            )))
        );
    }

    let at_once = deploy(
        &translated,
        &[(sam::DEPLOYMENT_TYPE.to_owned(), sam::ALL_AT_ONCE.to_owned())],
    );
    let unwatched = deployment_alarms(&translated, &at_once);
    assert_eq!(unwatched.len(), gradual.len());
    assert!(
        unwatched.values().all(Vec::is_empty),
        "AllAtOnce: {unwatched:?}"
    );
}
