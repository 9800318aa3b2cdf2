//! The real `paybus serve` binary on a free loopback port, against a test's own database and
//! vhost, with every secret set; the `paybus` command line pointed at it as one person; and the
//! Python tools of the black-box tests (schemathesis, playwright), which
//! `infra/browser/install.sh` installs into `.local/venv`.
#![allow(dead_code)] // each test binary uses its own part

use std::{
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use paybus_testkit::{
    TestEnv, free_port,
    oidc::{self, OidcProvider, OidcSetup},
};

pub const ADMIN_JWT_SECRET: &str = "admin-jwt-secret-for-black-box-tests";
/// What the chain monitor signs its confirmations with, here.
pub const CHAIN_MONITOR_SECRET: &str = "chain-monitor-secret-for-black-box-tests";
/// What the payment service signs its completions with, here.
pub const PAYMENTS_SECRET: &str = "payments-secret-for-black-box-tests";

/// `paybus` on `env`'s database and vhost (its `PAYBUS_*` variables), for a test to add
/// arguments and variables to.
pub fn paybus(env: &TestEnv) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_paybus"));
    command.envs(env.env_vars());
    command
}

/// What `command` printed and how it exited (one that cannot start fails the test).
pub fn output_of(command: &mut Command) -> Output {
    command.output().expect("run paybus")
}

/// The switch that lets the API take tokens signed with `PAYBUS_ADMIN_JWT_SECRET` (break-glass;
/// how these tests mint a person's token): set for every process the tests start.
const BREAK_GLASS: (&str, &str) = ("PAYBUS_BREAK_GLASS", "on");

/// `paybus serve`, killed when dropped.
pub struct ApiProcess {
    pub base_url: String,
    child: Child,
    /// The identity provider people sign in with, when started [`with_provider`](Self::with_provider).
    pub provider: Option<OidcProvider>,
}

impl ApiProcess {
    /// Starts the binary and waits until `/health` answers (at most 30 s).
    pub async fn start(env: &TestEnv) -> Self {
        Self::start_with(env, &[]).await
    }

    /// [`start_with`](Self::start_with) behind a real identity provider
    /// (`paybus_testkit::oidc`): the people of [`token_of`](Self::token_of) and
    /// [`cli_as`](Self::cli_as) are the provider's, as four-eyes needs. `None` when the
    /// provider's tools are missing (the test is skipped; see `OidcProvider::start`).
    pub async fn with_provider(env: &TestEnv, vars: &[(&str, Option<&str>)]) -> Option<Self> {
        let provider = OidcProvider::start(OidcSetup::default()).await?;
        let issuer = provider.issuer();
        let audience = provider.audience().to_owned();
        let mut all = vec![
            ("PAYBUS_OIDC_ISSUER", Some(issuer.as_str())),
            ("PAYBUS_OIDC_AUDIENCE", Some(audience.as_str())),
        ];
        all.extend_from_slice(vars);
        let mut process = Self::start_with(env, &all).await;
        process.provider = Some(provider);
        Some(process)
    }

    /// [`start`](Self::start) with `vars` changed in its environment: set to `Some`, removed
    /// for `None` (four-eyes off, other secrets keys, ...).
    pub async fn start_with(env: &TestEnv, vars: &[(&str, Option<&str>)]) -> Self {
        Self::start_on(env, free_port(), vars).await
    }

    /// [`start_with`](Self::start_with) on `port`, for a test that must name the address
    /// before the process starts (an identity provider's redirect URIs).
    pub async fn start_on(env: &TestEnv, port: u16, vars: &[(&str, Option<&str>)]) -> Self {
        let log = std::env::var("TEST_LOG").map_or_else(|_| Stdio::null(), |_| Stdio::inherit());
        let mut command = paybus(env);
        command
            .arg("serve")
            .env(BREAK_GLASS.0, BREAK_GLASS.1)
            .env("PAYBUS_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_JWT_SECRET)
            .env("PAYBUS_CHAIN_MONITOR_SECRET", CHAIN_MONITOR_SECRET)
            .env("PAYBUS_PAYMENTS_SECRET", PAYMENTS_SECRET)
            .env(
                "PAYBUS_PARTNER_KEY_HASH_KEY",
                "partner-key-hash-key-for-black-box-tests",
            )
            // Deposit orders go to match-deposit through the broker, as deployed. With inline
            // matching and no quote service, creating one answers the documented 503, which
            // the fuzzer rightly counts as a server error.
            .env("PAYBUS_ASYNC_MATCHING_ENABLED", "true");
        for (name, value) in vars {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start paybus serve");
        let process = Self {
            base_url: format!("http://127.0.0.1:{port}"),
            child,
            provider: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let health = format!("{}/health", process.base_url);
        while Instant::now() < deadline {
            let answered = reqwest::get(&health)
                .await
                .is_ok_and(|response| response.status().is_success());
            if answered {
                return process;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("paybus serve did not answer {health} within 30 s");
    }

    /// POSTs `body` to the admin API with `token`, as ops would: the JSON answer (asserting
    /// it succeeded).
    pub async fn admin_post(
        &self,
        token: &str,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let response = reqwest::Client::new()
            .post(format!("{}{path}", self.base_url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .expect("admin request");
        let status = response.status();
        let answer: serde_json::Value = response.json().await.expect("JSON answer");
        assert!(status.is_success(), "POST {path}: {status} {answer}");
        answer
    }

    /// POSTs `body` signed with `secret` as the chain monitor and the payment service sign
    /// (`paybus_config::signature`): the JSON answer (asserting it succeeded).
    pub async fn signed_post(
        &self,
        secret: &str,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let body = body.to_string();
        let response = reqwest::Client::new()
            .post(format!("{}{path}", self.base_url))
            .header(
                paybus_config::signature::HEADER,
                paybus_config::signature::sign(
                    secret.as_bytes(),
                    chrono::Utc::now().timestamp(),
                    body.as_bytes(),
                ),
            )
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("signed request");
        let status = response.status();
        let answer: serde_json::Value = response.json().await.expect("JSON answer");
        assert!(status.is_success(), "POST {path}: {status} {answer}");
        answer
    }

    /// A token with `roles` (`OPS`, `ADMIN`), minted by `paybus token issue` as ops would.
    pub fn token(&self, roles: &[&str]) -> String {
        self.token_of("black-box-tests", roles)
    }

    /// [`token`](Self::token) of another person (four-eyes needs two): an access token the
    /// provider signs, when there is one, of `subject` in the groups of `roles`; else a
    /// break-glass token minted by `paybus token issue`, which four-eyes refuses.
    pub fn token_of(&self, subject: &str, roles: &[&str]) -> String {
        if let Some(provider) = &self.provider {
            let groups: Vec<&str> = roles
                .iter()
                .map(|role| match *role {
                    "ADMIN" => oidc::ADMINS_GROUP,
                    "OPS" => oidc::OPS_GROUP,
                    other => other,
                })
                .collect();
            let mut claims = provider.claims_for(subject);
            claims["groups"] = serde_json::json!(groups);
            return provider.sign(claims);
        }
        let mut command = Command::new(env!("CARGO_BIN_EXE_paybus"));
        command
            .args(["token", "issue", "--subject", subject, "--ttl", "1h"])
            .env("PAYBUS_ADMIN_JWT_SECRET", ADMIN_JWT_SECRET)
            .env(BREAK_GLASS.0, BREAK_GLASS.1);
        for role in roles {
            command.args(["--role", role]);
        }
        let output = command.output().expect("run paybus token issue");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    }

    /// `paybus` as `subject`, an ADMIN (a token of theirs in `PAYBUS_TOKEN`), calling this API;
    /// the reads it makes go to `env`'s database.
    pub fn cli_as(&self, env: &TestEnv, subject: &str) -> Command {
        let mut command = self.cli(env);
        command.env("PAYBUS_TOKEN", self.token_of(subject, &["ADMIN"]));
        command
    }

    /// `paybus` calling this API with no token of its own: no `PAYBUS_TOKEN`, and a config
    /// folder that holds no sign-in unless the test puts one there.
    pub fn cli(&self, env: &TestEnv) -> Command {
        let mut command = paybus(env);
        command
            .env(BREAK_GLASS.0, BREAK_GLASS.1)
            .env("PAYBUS_API_URL", &self.base_url)
            .env_remove("PAYBUS_TOKEN")
            .env(
                "XDG_CONFIG_HOME",
                std::env::temp_dir().join("paybus-tests-no-sign-in"),
            );
        command
    }
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An ADMIN's access token for `subject`, signed with `provider`'s key as its own tokens are:
/// what a test's own API calls (the rows a browser walk starts from) are made with.
pub fn provider_admin_token(provider: &OidcProvider, subject: &str) -> String {
    let mut claims = provider.claims_for(subject);
    claims["groups"] = serde_json::json!([oidc::ADMINS_GROUP]);
    provider.sign(claims)
}

/// A Python tool of the black-box tests, or why it is missing (see [`installed`]).
pub fn python_tool(variable: &str, venv_name: &str) -> Option<PathBuf> {
    installed(variable, &format!(".local/venv/bin/{venv_name}"))
}

/// axe-core's browser script (`axe.min.js`), which the console's page test injects into every
/// page, or why it is missing (see [`installed`]).
pub fn axe_script() -> Option<PathBuf> {
    installed(
        "PAYBUS_TEST_AXE",
        ".local/axe/node_modules/axe-core/axe.min.js",
    )
}

/// What `infra/browser/install.sh` installs for the black-box tests: `variable`'s path, else
/// `default` under the repository. Missing fails the test when `PAYBUS_REQUIRE_PYTHON_TESTS` is
/// set (infra/test.sh sets it, so CI never skips) and skips it otherwise, saying how to install.
fn installed(variable: &str, default: &str) -> Option<PathBuf> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(default));
    if path.exists() {
        return Some(path);
    }
    let message = format!(
        "{} is missing: run infra/browser/install.sh (infra/test.sh does)",
        path.display()
    );
    if std::env::var_os("PAYBUS_REQUIRE_PYTHON_TESTS").is_some() {
        panic!("{message}");
    }
    eprintln!("SKIPPED: {message}");
    None
}

/// Where a test run leaves what people look at (screenshots, reports).
pub fn output_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.local/test-output")
        .join(name);
    std::fs::create_dir_all(&dir).expect("create the test output directory");
    dir
}

/// A console session for `token`'s holder, opened at `base_url` with the login page's
/// break-glass form (the process must have break-glass on): the `paybus_console` cookie's
/// value. The console keeps sessions, not tokens, in its cookie.
pub async fn console_session(base_url: &str, token: &str) -> String {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client");
    // A JWT is base64url and dots: nothing to escape in a form.
    let answer = client
        .post(format!("{base_url}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"))
        .send()
        .await
        .expect("the console's login");
    assert_eq!(answer.status(), 303, "the break-glass session opens");
    answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(|cookie| cookie.strip_prefix("paybus_console=")?.split(';').next())
        .filter(|secret| !secret.is_empty())
        .expect("a session cookie")
        .to_owned()
}
