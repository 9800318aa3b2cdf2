//! What each Lambda reads at start-up: its secrets (as references, never values) and its plain
//! settings, from the binary and what its catalog function declares.

use paybus_config::secrets::FROM_SUFFIX;
use paybus_runtime::function::FunctionEntry;

use crate::FUNCTIONS;

/// A secret a Lambda reads at start-up. The template never holds its value: the function gets
/// `<variable>_FROM` = the reference in `parameter` (any form `paybus_config::secrets`
/// reads: a secret's ARN or name, `#key` of a JSON secret, an SSM parameter), and the right
/// to read exactly that secret or parameter (`policies::read_statement`); the process fetches it
/// through the Parameters and Secrets extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretSetting {
    pub variable: &'static str,
    /// The template parameter holding the reference (named `…SecretArn` since the first
    /// release, which took ARNs only: renaming would break every saved `samconfig.toml`).
    pub parameter: &'static str,
    pub(super) description: &'static str,
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
    pub(super) description: &'static str,
    pub(super) default: &'static str,
    /// The values the parameter accepts (empty: any string).
    pub(super) allowed: &'static [&'static str],
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
pub(super) fn function_needs(function: &FunctionEntry) -> Needs {
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
