//! Settings read from AWS Secrets Manager or SSM Parameter Store at start-up.
//!
//! A Lambda's environment is readable by anyone allowed to see the function's configuration, so
//! in AWS no secret is put there: `<VARIABLE>_FROM` holds a reference (a Secrets Manager secret's
//! ARN or name, an SSM parameter; `#key` takes one key of a JSON secret), and the process
//! fetches the value once, before it reads its settings, through the AWS Parameters and Secrets
//! Lambda Extension, into the process's one reading of its configuration ([`resolve`]): every
//! setting read from it sees the value as if it were in the environment; it is never written
//! back or logged. Setting both `X` and `X_FROM` is refused: which one wins would be a guess.
//! The forms: docs/configuration.md ("Secrets from AWS").

use std::{collections::HashMap, time::Duration};

use url::Url;

use crate::{Vars, setting::Setting};

/// The suffix that turns a variable into a reference to its value.
pub const FROM_SUFFIX: &str = "_FROM";

/// Every `PAYBUS_*` variable's reference form: one row on the page for all of them.
pub const VAR_FROM: Setting = Setting {
    name: "PAYBUS_<NAME>_FROM",
    default: "unset",
    about: "instead of `PAYBUS_<NAME>`: a Secrets Manager secret (ARN or name, optionally \
            `#json-key`) or SSM parameter (`/path` or ARN) read once at start-up through the AWS \
            Parameters and Secrets Lambda Extension; setting both is refused (exit 2). The SAM \
            template sets only these for secrets",
};

/// The extension's port (its own setting).
pub const VAR_EXTENSION_PORT: Setting = Setting {
    name: "PARAMETERS_SECRETS_EXTENSION_HTTP_PORT",
    default: "`2773`",
    about: "the AWS Parameters and Secrets Lambda Extension's port on localhost, where \
            `PAYBUS_<NAME>_FROM` references are fetched (the extension's own setting)",
};
const PORT_VARIABLE: &str = VAR_EXTENSION_PORT.name;
const DEFAULT_PORT: u16 = 2773;

/// What start-up reads before any other setting, in the order the page lists them.
pub const SETTINGS: &[Setting] = &[VAR_FROM, VAR_EXTENSION_PORT];

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{variable} and {variable}{FROM_SUFFIX} are both set: set one")]
    Both { variable: String },
    #[error("cannot read {variable} from {reference}: {reason}")]
    Fetch {
        variable: String,
        reference: String,
        reason: String,
    },
}

/// The process's configuration: `environment` with every `PAYBUS_*_FROM` reference fetched
/// (concurrently) into the variable it names. What [`Settings`](crate::Settings) and every
/// setting after it read ([`Settings::vars`](crate::Settings::vars)).
pub async fn resolve(environment: HashMap<String, String>) -> Result<Vars, SecretError> {
    let references: Vec<(String, String)> = environment
        .iter()
        .filter(|(_, reference)| !reference.trim().is_empty())
        .filter_map(|(name, reference)| {
            let variable = name.strip_suffix(FROM_SUFFIX)?;
            variable
                .starts_with("PAYBUS_")
                .then(|| (variable.to_owned(), reference.trim().to_owned()))
        })
        .collect();
    if references.is_empty() {
        return Ok(Vars::new(environment));
    }
    for (variable, _) in &references {
        if environment
            .get(variable)
            .is_some_and(|value| !value.trim().is_empty())
        {
            return Err(SecretError::Both {
                variable: variable.clone(),
            });
        }
    }
    let extension = Extension::from_environment(&environment);
    let fetched = futures_util::future::join_all(
        references
            .iter()
            .map(|(variable, reference)| extension.value(variable, reference)),
    )
    .await;
    let mut values = environment;
    for ((variable, _), value) in references.into_iter().zip(fetched) {
        values.insert(variable, value?);
    }
    Ok(Vars::new(values))
}

/// The Parameters and Secrets extension's local HTTP API.
struct Extension {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Extension {
    fn from_environment(environment: &HashMap<String, String>) -> Self {
        let port = environment
            .get(PORT_VARIABLE)
            .and_then(|port| port.trim().parse::<u16>().ok())
            .unwrap_or(DEFAULT_PORT);
        Self {
            base: format!("http://localhost:{port}"),
            token: environment
                .get("AWS_SESSION_TOKEN")
                .cloned()
                .unwrap_or_default(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
        }
    }

    async fn value(&self, variable: &str, reference: &str) -> Result<String, SecretError> {
        let fail = |reason: String| SecretError::Fetch {
            variable: variable.to_owned(),
            reference: reference.to_owned(),
            reason,
        };
        let Reference { id, key, store } = Reference::parse(reference);
        let parameter = store == Store::ParameterStore;
        let url = self.url(id, parameter).map_err(&fail)?;
        let response = self
            .client
            .get(url)
            .header("X-Aws-Parameters-Secrets-Token", &self.token)
            .send()
            .await
            .map_err(|e| {
                fail(format!(
                    "the Parameters and Secrets extension did not answer ({e}); is its layer attached?"
                ))
            })?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| fail(format!("reading the extension's answer: {e}")))?;
        if !status.is_success() {
            // The extension relays Secrets Manager's error (not found, access denied), which
            // names the secret but never carries its value.
            let detail: String = body.chars().take(300).collect();
            return Err(fail(format!("the extension answered {status}: {detail}")));
        }
        let value = if parameter {
            serde_json::from_str::<ParameterAnswer>(&body)
                .map(|answer| answer.parameter.value)
                .map_err(|e| fail(format!("unexpected answer for a parameter: {e}")))?
        } else {
            serde_json::from_str::<SecretAnswer>(&body)
                .map_err(|e| fail(format!("unexpected answer for a secret: {e}")))?
                .secret_string
                .ok_or_else(|| fail("the secret has no string value".to_owned()))?
        };
        match key {
            None => Ok(value),
            Some(key) => json_key(&value, key).ok_or_else(|| {
                fail(format!(
                    "the value is not a JSON object with a string under {key:?}"
                ))
            }),
        }
    }

    fn url(&self, id: &str, parameter: bool) -> Result<Url, String> {
        let path = if parameter {
            "/systemsmanager/parameters/get"
        } else {
            "/secretsmanager/get"
        };
        let mut url = Url::parse(&format!("{}{path}", self.base)).map_err(|e| e.to_string())?;
        if parameter {
            url.query_pairs_mut()
                .append_pair("name", id)
                .append_pair("withDecryption", "true");
        } else {
            url.query_pairs_mut().append_pair("secretId", id);
        }
        Ok(url)
    }
}

/// Where a `_FROM` reference's value is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    SecretsManager,
    /// SSM Parameter Store (a String or a SecureString, read decrypted).
    ParameterStore,
}

/// A `_FROM` reference taken apart: which secret or parameter, and which key of its JSON
/// value. The SAM template derives each function's permissions from the same forms (its
/// conditions mirror [`Reference::parse`]; a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference<'a> {
    /// The secret (ARN or name) or parameter (ARN or `/path`), without the `#key`.
    pub id: &'a str,
    /// The key after `#`, for a value that is a JSON object.
    pub key: Option<&'a str>,
    pub store: Store,
}

impl<'a> Reference<'a> {
    /// An SSM parameter is `arn:…:ssm:…:parameter/…` or a path (`/…`); anything else is a
    /// Secrets Manager secret (its ARN or its name).
    pub fn parse(reference: &'a str) -> Self {
        let (id, key) = match reference.split_once('#') {
            Some((id, key)) => (id, Some(key)),
            None => (reference, None),
        };
        let parameter = id.starts_with('/') || id.split(':').nth(2) == Some("ssm");
        Self {
            id,
            key,
            store: if parameter {
                Store::ParameterStore
            } else {
                Store::SecretsManager
            },
        }
    }
}

fn json_key(value: &str, key: &str) -> Option<String> {
    serde_json::from_str::<serde_json::Value>(value)
        .ok()?
        .get(key)?
        .as_str()
        .map(str::to_owned)
}

#[derive(serde::Deserialize)]
struct SecretAnswer {
    #[serde(rename = "SecretString")]
    secret_string: Option<String>,
}

#[derive(serde::Deserialize)]
struct ParameterAnswer {
    #[serde(rename = "Parameter")]
    parameter: Parameter,
}

#[derive(serde::Deserialize)]
struct Parameter {
    #[serde(rename = "Value")]
    value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_parameter(reference: &str) -> bool {
        Reference::parse(reference).store == Store::ParameterStore
    }

    #[test]
    fn references_are_secrets_unless_they_name_a_parameter() {
        assert!(!is_parameter(
            "arn:aws:secretsmanager:eu-central-1:123456789012:secret:paybus-db-AbCdEf"
        ));
        assert!(!is_parameter("paybus/db"));
        assert!(is_parameter("/paybus/db-url"));
        assert!(is_parameter(
            "arn:aws:ssm:eu-central-1:123456789012:parameter/paybus/db-url"
        ));
    }

    #[test]
    fn a_key_is_split_off_the_reference() {
        let reference = Reference::parse("paybus/db#url");
        assert_eq!(
            (reference.id, reference.key, reference.store),
            ("paybus/db", Some("url"), Store::SecretsManager)
        );
        assert_eq!(Reference::parse("/paybus/db#url").id, "/paybus/db");
    }

    #[test]
    fn a_key_is_taken_from_a_json_secret() {
        let value = r#"{"url":"mysql://u:p@db/paybus","other":1}"#;
        assert_eq!(
            json_key(value, "url").as_deref(),
            Some("mysql://u:p@db/paybus")
        );
        assert_eq!(json_key(value, "other"), None);
        assert_eq!(json_key("not json", "url"), None);
    }

    #[test]
    fn urls_escape_the_reference() {
        let extension = Extension::from_environment(&HashMap::from([(
            PORT_VARIABLE.to_owned(),
            "9999".to_owned(),
        )]));
        let secret = extension
            .url("arn:aws:secretsmanager:eu-central-1:1:secret:a/b", false)
            .unwrap();
        assert_eq!(
            secret.as_str(),
            "http://localhost:9999/secretsmanager/get?secretId=arn%3Aaws%3Asecretsmanager%3Aeu-central-1%3A1%3Asecret%3Aa%2Fb"
        );
        let parameter = extension.url("/paybus/db", true).unwrap();
        assert_eq!(
            parameter.as_str(),
            "http://localhost:9999/systemsmanager/parameters/get?name=%2Fpaybus%2Fdb&withDecryption=true"
        );
    }
}
