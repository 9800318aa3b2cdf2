//! The AWS SAM template (`infra/aws/template.yaml`), generated from the catalog by
//! `paybus template`; a test keeps the shipped file equal to it and runs `cfn-lint` on it.
//!
//! One Lambda per catalog function on its Amazon MQ queue, the dead-letter recorder on every
//! dead-letter queue and `paybus.unrouted`, the sweeper on a schedule, the HTTP API behind an
//! API Gateway HTTP API, and the `migrate` function behind a custom resource that every other
//! function depends on. Secrets are references (`PAYBUS_*_FROM`, see
//! `paybus_config::secrets`), never values; alarms cover every dead-letter queue, every
//! function's errors and the API's 5xx answers.

use paybus_bus::topology::{UNROUTED_QUEUE, dead_letter_queue_name};
use paybus_config::{Shards, secrets::FROM_SUFFIX};
use paybus_runtime::function::FunctionEntry;

use crate::{
    FUNCTIONS,
    yaml::{Node, get_att, list, map, reference, sub},
};

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

/// A secret a Lambda reads at start-up. The template never holds its value: the function gets
/// `<variable>_FROM` = the reference in `parameter` (any form `paybus_config::secrets`
/// reads: a secret's ARN or name, `#key` of a JSON secret, an SSM parameter), and the right
/// to read exactly that secret or parameter ([`read_statement`]); the process fetches it
/// through the Parameters and Secrets extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretSetting {
    pub variable: &'static str,
    /// The template parameter holding the reference (named `…SecretArn` since the first
    /// release, which took ARNs only: renaming would break every saved `samconfig.toml`).
    pub parameter: &'static str,
    description: &'static str,
}

impl SecretSetting {
    /// `PAYBUS_X_FROM`.
    pub fn reference_variable(&self) -> String {
        format!("{}{FROM_SUFFIX}", self.variable)
    }
}

pub const DATABASE_URL: SecretSetting = SecretSetting {
    variable: "PAYBUS_DATABASE_URL",
    parameter: "DatabaseUrlSecretArn",
    description: "PAYBUS_DATABASE_URL (mysql://user:password@host:3306/paybus)",
};
pub const AMQP_URL: SecretSetting = SecretSetting {
    variable: "PAYBUS_AMQP_URL",
    parameter: "AmqpUrlSecretArn",
    description: "PAYBUS_AMQP_URL (amqps://user:password@<broker>.mq.<region>.amazonaws.com:5671/%2f)",
};
pub const ADMIN_JWT_SECRET: SecretSetting = SecretSetting {
    variable: "PAYBUS_ADMIN_JWT_SECRET",
    parameter: "AdminJwtSecretArn",
    description: "PAYBUS_ADMIN_JWT_SECRET (at least 32 characters)",
};
pub const CHAIN_MONITOR_SECRET: SecretSetting = SecretSetting {
    variable: "PAYBUS_CHAIN_MONITOR_SECRET",
    parameter: "ChainMonitorSecretArn",
    description: "PAYBUS_CHAIN_MONITOR_SECRET (at least 16 characters)",
};
pub const PAYMENTS_SECRET: SecretSetting = SecretSetting {
    variable: "PAYBUS_PAYMENTS_SECRET",
    parameter: "PaymentsSecretArn",
    description: "PAYBUS_PAYMENTS_SECRET, the key the payment service signs gateway completions with (bonuses; at least 16 characters)",
};
pub const SECRETS_KEY: SecretSetting = SecretSetting {
    variable: "PAYBUS_SECRETS_KEY",
    parameter: "SecretsKeySecretArn",
    description: "PAYBUS_SECRETS_KEY, the key partner webhook secrets are sealed with at rest (32 bytes as 64 hex digits or base64)",
};
pub const PARTNER_KEY_HASH_KEY: SecretSetting = SecretSetting {
    variable: "PAYBUS_PARTNER_KEY_HASH_KEY",
    parameter: "PartnerKeyHashKeySecretArn",
    description: "PAYBUS_PARTNER_KEY_HASH_KEY, the server key partner API keys are hashed under (at least 32 characters)",
};
pub const QUOTE_API_KEY: SecretSetting = SecretSetting {
    variable: "PAYBUS_QUOTE_API_KEY",
    parameter: "QuoteApiKeySecretArn",
    description: "PAYBUS_QUOTE_API_KEY, sent to the quote service as a bearer token (p2p; at least 16 characters)",
};

pub const OIDC_CONSOLE_CLIENT_SECRET: SecretSetting = SecretSetting {
    variable: "PAYBUS_OIDC_CONSOLE_CLIENT_SECRET",
    parameter: "OidcConsoleClientSecretArn",
    description: "PAYBUS_OIDC_CONSOLE_CLIENT_SECRET, the secret of the console's confidential app client at the identity provider (the authorization code flow; any placeholder until people sign in through a provider)",
};

/// Every secret parameter of the template, in its order.
pub const SECRETS: &[SecretSetting] = &[
    DATABASE_URL,
    AMQP_URL,
    ADMIN_JWT_SECRET,
    CHAIN_MONITOR_SECRET,
    PAYMENTS_SECRET,
    QUOTE_API_KEY,
    SECRETS_KEY,
    PARTNER_KEY_HASH_KEY,
    OIDC_CONSOLE_CLIENT_SECRET,
];

/// A setting that is no secret, passed as a plain variable from a template parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainSetting {
    pub variable: &'static str,
    pub parameter: &'static str,
    description: &'static str,
    default: &'static str,
    /// The values the parameter accepts (empty: any string).
    allowed: &'static [&'static str],
}

pub const QUOTE_URL: PlainSetting = PlainSetting {
    variable: "PAYBUS_QUOTE_URL",
    parameter: "QuoteServiceUrl",
    description: "PAYBUS_QUOTE_URL: the quote service's base URL (p2p, https://...). Empty: every matching attempt fails, counted and visible, and the create API refuses inline matching (503)",
    default: "",
    allowed: &[],
};
pub const ASYNC_MATCHING_ENABLED: PlainSetting = PlainSetting {
    variable: "PAYBUS_ASYNC_MATCHING_ENABLED",
    parameter: "AsyncMatchingEnabled",
    description: "PAYBUS_ASYNC_MATCHING_ENABLED: true hands new deposit orders to match-deposit through the queue; false (the safe default) matches them inline in the create request (p2p)",
    default: "false",
    allowed: &["false", "true"],
};

pub const OIDC_ISSUER: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_ISSUER",
    parameter: "OidcIssuer",
    description: "PAYBUS_OIDC_ISSUER: the identity provider people sign in with, its issuer URL (Amazon Cognito: https://cognito-idp.<region>.amazonaws.com/<user pool id>). Empty: nobody can sign in and only break-glass tokens reach the admin API (BreakGlass)",
    default: "",
    allowed: &[],
};
pub const OIDC_AUDIENCE: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_AUDIENCE",
    parameter: "OidcAudience",
    description: "PAYBUS_OIDC_AUDIENCE: what the provider's access tokens for paybus name in aud (Amazon Cognito: the app client id, which its access tokens carry in client_id); required with OidcIssuer",
    default: "",
    allowed: &[],
};
pub const OIDC_ROLES_CLAIM: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_ROLES_CLAIM",
    parameter: "OidcRolesClaim",
    description: "PAYBUS_OIDC_ROLES_CLAIM: the token claim that lists a person's groups (Amazon Cognito: cognito:groups)",
    default: "cognito:groups",
    allowed: &[],
};
pub const OIDC_ADMIN_GROUPS: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_ADMIN_GROUPS",
    parameter: "OidcAdminGroups",
    description: "PAYBUS_OIDC_ADMIN_GROUPS: the groups whose people are ADMIN (comma-separated)",
    default: "paybus-admins",
    allowed: &[],
};
pub const OIDC_OPS_GROUPS: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_OPS_GROUPS",
    parameter: "OidcOpsGroups",
    description: "PAYBUS_OIDC_OPS_GROUPS: the groups whose people are OPS (comma-separated); anyone else is refused",
    default: "paybus-ops",
    allowed: &[],
};
pub const OIDC_CLI_CLIENT_ID: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_CLI_CLIENT_ID",
    parameter: "OidcCliClientId",
    description: "PAYBUS_OIDC_CLI_CLIENT_ID: the provider's public client paybus login uses (the device authorization grant)",
    default: "paybus-cli",
    allowed: &[],
};
pub const OIDC_CONSOLE_CLIENT_ID: PlainSetting = PlainSetting {
    variable: "PAYBUS_OIDC_CONSOLE_CLIENT_ID",
    parameter: "OidcConsoleClientId",
    description: "PAYBUS_OIDC_CONSOLE_CLIENT_ID: the console's confidential app client (its callback is <ConsoleUrl>/console/callback)",
    default: "paybus-console",
    allowed: &[],
};
pub const CONSOLE_URL: PlainSetting = PlainSetting {
    variable: "PAYBUS_CONSOLE_URL",
    parameter: "ConsoleUrl",
    description: "PAYBUS_CONSOLE_URL: the console's public base URL, https://<your API's domain> (the sign-in's redirect URIs; https makes its cookies Secure). Empty: the API Gateway's own URL must be set here once known",
    default: "",
    allowed: &[],
};
pub const BREAK_GLASS: PlainSetting = PlainSetting {
    variable: "PAYBUS_BREAK_GLASS",
    parameter: "BreakGlass",
    description: "PAYBUS_BREAK_GLASS: true lets the admin API also take tokens signed with the admin JWT key (paybus token issue), each marked break-glass and alarmed on; for a first deployment before the provider is set up, or a provider outage",
    default: "false",
    allowed: &["false", "true"],
};

/// The identity provider's settings, which only the API reads.
pub const IDENTITY_SETTINGS: &[PlainSetting] = &[
    OIDC_ISSUER,
    OIDC_AUDIENCE,
    OIDC_ROLES_CLAIM,
    OIDC_ADMIN_GROUPS,
    OIDC_OPS_GROUPS,
    OIDC_CLI_CLIENT_ID,
    OIDC_CONSOLE_CLIENT_ID,
    CONSOLE_URL,
    BREAK_GLASS,
];

/// The workflows' plain setting parameters, in their order (the identity provider's follow,
/// [`IDENTITY_SETTINGS`]).
pub const PLAIN_SETTINGS: &[PlainSetting] = &[QUOTE_URL, ASYNC_MATCHING_ENABLED];

/// What one Lambda reads beyond the globals every function gets (the database URL's
/// reference, the pool size, the batch concurrency, the log settings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// Secrets besides the database URL's (which every Lambda reads).
    pub secrets: Vec<SecretSetting>,
    pub settings: Vec<PlainSetting>,
}

impl Needs {
    fn add(&mut self, other: Needs) {
        for secret in other.secrets {
            if !self.secrets.contains(&secret) {
                self.secrets.push(secret);
            }
        }
        for setting in other.settings {
            if !self.settings.contains(&setting) {
                self.settings.push(setting);
            }
        }
    }
}

/// What the Lambda running `binary` reads at start-up. A test derives the secrets each binary
/// reads from the code (every `Vars::secret` call its crates make) and insists they are
/// here.
pub fn needs(binary: &str) -> Needs {
    let bus = Needs {
        secrets: vec![AMQP_URL],
        settings: Vec::new(),
    };
    match binary {
        // Records into the database; publishes nothing.
        "dead-letters" => Needs::default(),
        // Seals the plaintext webhook secrets of earlier releases.
        "migrate" => Needs {
            secrets: vec![AMQP_URL, SECRETS_KEY],
            settings: Vec::new(),
        },
        "api" => {
            let mut api = Needs {
                secrets: vec![
                    AMQP_URL,
                    ADMIN_JWT_SECRET,
                    CHAIN_MONITOR_SECRET,
                    PAYMENTS_SECRET,
                    // Partner create seals the webhook secret.
                    SECRETS_KEY,
                    // The partner API checks partners' keys.
                    PARTNER_KEY_HASH_KEY,
                    // The console's sign-in redeems its codes as a confidential client.
                    OIDC_CONSOLE_CLIENT_SECRET,
                ],
                settings: [&[ASYNC_MATCHING_ENABLED], IDENTITY_SETTINGS].concat(),
            };
            // The create route matches inline with the same quote service as match-deposit.
            api.add(function_needs(&FunctionEntry::of::<
                paybus_match_deposit::MatchDeposit,
            >()));
            api
        }
        // Runs every function's jobs (match-deposit's due orders call the quote service).
        "sweeper" => {
            let mut sweeper = bus;
            for function in FUNCTIONS {
                sweeper.add(function_needs(function));
            }
            sweeper
        }
        function => {
            let mut consumer = bus;
            if let Some(function) = FUNCTIONS.iter().find(|f| f.name == function) {
                consumer.add(function_needs(function));
            }
            consumer
        }
    }
}

/// A catalog function's own secrets and settings beyond the bus (its handler's and its jobs'),
/// as it declares them on its `Function` impl. One it declares without a template parameter
/// is left out here, and the catalog's tests fail on it.
fn function_needs(function: &FunctionEntry) -> Needs {
    Needs {
        secrets: SECRETS
            .iter()
            .filter(|secret| function.secrets.iter().any(|s| s.name == secret.variable))
            .copied()
            .collect(),
        settings: PLAIN_SETTINGS
            .iter()
            .filter(|setting| {
                function
                    .deployed_settings
                    .iter()
                    .any(|s| s.name == setting.variable)
            })
            .copied()
            .collect(),
    }
}

/// A Lambda's `Environment` (its variables beyond the globals) and `Policies` from its needs.
fn add_needs(properties: &mut Node, binary: &str) {
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
fn triggered_by_mq(binary: &str) -> bool {
    binary == "dead-letters" || FUNCTIONS.iter().any(|f| f.name == binary)
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

    map! {
        "AWSTemplateFormatVersion" => "2010-09-09",
        "Transform" => "AWS::Serverless-2016-10-31",
        "Description" => "paybus: one Lambda per function on Amazon MQ for RabbitMQ, the dead-letter recorder, the sweeper, the HTTP API and the migrations (generated from the function catalog)",
        "Parameters" => parameters(),
        "Conditions" => conditions(),
        "Globals" => globals(shards),
        "Resources" => resources,
        "Outputs" => outputs,
    }
}

/// One Lambda per catalog function on its queue (one trigger per shard), with its log group
/// and alarms.
fn add_consumer(
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
    add_queue_alarm(
        resources,
        &format!("{}DeadLetterQueueAlarm", lambda.logical_id),
        &dead_letter_queue_name(function.name),
    );
}

/// The dead-letter recorder: one MQ event per dead-letter queue, and paybus.unrouted.
fn add_recorder(resources: &mut Node) {
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
    resources.insert_commented(
        Some("The dead-letter recorder: what every function dead-letters ends up in `dead_letters`,\nonce however often a batch is replayed."),
        &recorder.function_id(),
        function_resource(&recorder, properties),
    );
    add_log_group(resources, &recorder);
    add_errors_alarm(resources, &recorder, MQ_INVOCATION_FAILED);
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
fn add_sweeper(resources: &mut Node) {
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
}

/// The HTTP API: the same axum router behind an API Gateway HTTP API.
fn add_api(resources: &mut Node) {
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
    resources.insert(
        "HttpApi5xxAlarm",
        alarm(
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
        ),
    );
}

/// Migrations and topology: a custom resource every other function depends on.
fn add_migration(resources: &mut Node, shards: &Shards) {
    let migrate = Deployable::new("migrate", "functions/migrate");
    let mut properties = common_properties(
        &migrate,
        "paybus migrate: database migrations and the RabbitMQ topology, on every deploy (custom resource)",
    );
    add_needs(&mut properties, migrate.binary);
    // A new version with every code change: the custom resource's `Version` follows it.
    properties.insert("AutoPublishAlias", "live");
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

fn conditions() -> Node {
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

/// Every parameter, in the order an operator fills them in.
fn parameters() -> Node {
    let mut p = map! {};
    broker_parameters(&mut p);
    secrets_parameters(&mut p);
    network_parameters(&mut p);
    capacity_parameters(&mut p);
    workflow_parameters(&mut p);
    operations_parameters(&mut p);
    consumption_parameters(&mut p);
    p
}

/// `<Function>Enabled`: the Amazon MQ trigger's `Enabled`, AWS's form of `paybus functions
/// pause` (the runbook's step: update the stack with it false; the messages wait in the
/// queue; true again drains them).
fn enabled_parameter(function: &str) -> String {
    format!("{}Enabled", pascal_case(function))
}

/// One switch per function's triggers.
fn consumption_parameters(p: &mut Node) {
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
fn broker_parameters(p: &mut Node) {
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
fn secrets_parameters(p: &mut Node) {
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
fn network_parameters(p: &mut Node) {
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
fn capacity_parameters(p: &mut Node) {
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
fn workflow_parameters(p: &mut Node) {
    plain_parameters(p, PLAIN_SETTINGS, "Workflow settings (not secrets).");
    plain_parameters(
        p,
        IDENTITY_SETTINGS,
        "Who signs in (the API only): the identity provider and break-glass.",
    );
}

fn plain_parameters(p: &mut Node, settings: &[PlainSetting], heading: &'static str) {
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
fn operations_parameters(p: &mut Node) {
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
fn string(description: &str) -> Node {
    map! { "Type" => "String", "Description" => description }
}

/// A `Number` parameter with its bounds.
fn number(description: &str, default: i64, min: i64, max: i64) -> Node {
    map! {
        "Type" => "Number",
        "Description" => description,
        "Default" => default,
        "MinValue" => min,
        "MaxValue" => max,
    }
}

fn globals(shards: &Shards) -> Node {
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
fn build_metadata(lambda: &Deployable) -> Node {
    map! {
        "BuildMethod" => "rust-cargolambda",
        "BuildProperties" => map! { "Binary" => lambda.binary },
    }
}

/// What every Lambda but `migrate` has: its code, its log group, its description.
fn common_properties(lambda: &Deployable, description: &str) -> Node {
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
fn function_resource(lambda: &Deployable, properties: Node) -> Node {
    map! {
        "Type" => "AWS::Serverless::Function",
        "DependsOn" => "Migration",
        "Metadata" => build_metadata(lambda),
        "Properties" => properties,
    }
}

/// An MQ event on `queue`.
fn mq_event_on(queue: &str) -> Node {
    map! { "Type" => "MQ", "Properties" => mq_event(queue) }
}

/// The properties of an MQ event on `queue`.
fn mq_event(queue: &str) -> Node {
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

/// The Lambda's own policy (least privilege): read each of `secrets` in whatever form its
/// reference takes, decrypt them when they are under customer-managed KMS keys, and, for an
/// Amazon MQ-triggered function, what the event source mapping needs of EC2 (SAM adds
/// `mq:DescribeBroker`, the broker credentials' secret and, through
/// `AWSLambdaVPCAccessExecutionRole`, only part of the EC2 actions).
fn policy(secrets: &[SecretSetting], mq_triggered: bool) -> Node {
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
const HAS_SECRETS_KMS_KEYS: &str = "HasSecretsKmsKeys";

/// `secret`'s reference without its `#key`: the secret or parameter itself.
fn reference_id(secret: &SecretSetting) -> Node {
    map! { "Fn::Select" => list![0i64, map! { "Fn::Split" => list!["#", reference(secret.parameter)] }] }
}

fn is_arn_condition(secret: &SecretSetting) -> String {
    format!("{}IsArn", secret.parameter)
}

fn is_parameter_condition(secret: &SecretSetting) -> String {
    format!("{}IsParameter", secret.parameter)
}

/// The conditions that tell the forms of `secret`'s reference apart at deploy time (the
/// value is a parameter), as `paybus_config::secrets::Reference::parse` does at start-up:
/// an ARN starts with `arn:`; an SSM parameter is a `/path` or an ARN whose service is `ssm`.
fn reference_conditions(conditions: &mut Node, secret: &SecretSetting) {
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
fn read_statement(secret: &SecretSetting) -> Node {
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

fn add_log_group(resources: &mut Node, lambda: &Deployable) {
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
fn add_errors_alarm(resources: &mut Node, lambda: &Deployable, what_failed: &str) {
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
const MQ_INVOCATION_FAILED: &str = "an invocation failed (an infrastructure fault, or an event from a queue that is not its own; Amazon MQ delivers the whole batch again until it succeeds)";

/// A queue that keeps ready messages for 15 minutes: its recorder is not draining it.
fn add_queue_alarm(resources: &mut Node, id: &str, queue: &str) {
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

fn alarm(
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
