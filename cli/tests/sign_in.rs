//! A person's sign-in as the command line keeps it, against the real identity provider
//! (`paybus_testkit::oidc`): `paybus login` runs the device flow (the link it prints opened and
//! approved on the provider's own pages), the tokens are stored 0600 in a 0700 folder, a
//! changing command acts as that person (the ops log names the provider's issuer and subject),
//! an access token about to expire is renewed with the refresh token before the call, `whoami`
//! reads whom the token names, `logout` revokes the refresh token at the provider (a renewal
//! with it is then refused: sign in again) and deletes the file; a sign-in is never sent to
//! another API; and `login` against an API that names no provider says so.

use crate::api_process;

use std::{
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Output, Stdio},
};

use api_process::ApiProcess;
use paybus_testkit::TestEnv;
use serde_json::{Value, json};

/// A config folder of the test's own (`XDG_CONFIG_HOME`), removed when dropped.
struct ConfigHome(PathBuf);

impl ConfigHome {
    fn new() -> Self {
        let path =
            std::env::temp_dir().join(format!("paybus-sign-in-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn credentials(&self) -> PathBuf {
        self.0.join("paybus/credentials.json")
    }

    /// The stored sign-in as if its access token had expired a minute ago (what an hour's wait
    /// does), the rest as `paybus login` left it.
    fn age_the_sign_in(&self) {
        let mut stored = self.stored();
        stored["expires_at"] =
            json!((chrono::Utc::now() - chrono::TimeDelta::minutes(1)).to_rfc3339());
        std::fs::write(self.credentials(), stored.to_string()).unwrap();
    }

    fn stored(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.credentials()).unwrap()).unwrap()
    }
}

impl Drop for ConfigHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `paybus login` as a person runs it: the link it prints is opened and approved as `user` on
/// the provider's own pages while the command waits.
async fn login(api: &ApiProcess, env: &TestEnv, home: &ConfigHome, user: &str) -> Output {
    let mut child = api
        .cli(env)
        .env("XDG_CONFIG_HOME", &home.0)
        .args(["login", "--api", &api.base_url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut printed = String::new();
    let link = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "login ended before it printed a link: {printed}"
        );
        printed.push_str(&line);
        if let Some(rest) = line.strip_prefix("Then open ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let provider = api.provider.as_ref().unwrap();
    provider.approve_device_code(&link, user).await.unwrap();
    let mut output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    printed.push_str(&rest);
    output.stderr = printed.into_bytes();
    output
}

/// The refresh token the provider answers `refresh_token` with: tokens, or its error.
async fn renew_at_provider(api: &ApiProcess, refresh_token: &str) -> Value {
    let provider = api.provider.as_ref().unwrap();
    let endpoint = provider.discovery().await["token_endpoint"]
        .as_str()
        .unwrap()
        .to_owned();
    reqwest::Client::new()
        .post(endpoint)
        .form(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token),
            ("client_id", paybus_testkit::oidc::CLI_CLIENT_ID),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

// The provider's pages are read on the runtime while `paybus login` waits in a blocking call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_logs_in_through_the_provider_acts_as_themselves_is_renewed_and_logs_out() {
    let env = TestEnv::new().await;
    let Some(api) = ApiProcess::with_provider(&env, &[]).await else {
        return;
    };
    let issuer = api.provider.as_ref().unwrap().issuer();
    let home = ConfigHome::new();
    let as_signed_in = || {
        let mut command = api.cli(&env);
        command.env("XDG_CONFIG_HOME", &home.0);
        command
    };

    let signed_in = login(&api, &env, &home, "alice").await;

    assert!(signed_in.status.success(), "{}", text(&signed_in));
    assert!(
        text(&signed_in).contains(&format!("Signed in to {} as alice", api.base_url)),
        "{}",
        text(&signed_in)
    );
    assert_eq!(mode(&home.0.join("paybus")), 0o700);
    assert_eq!(mode(&home.credentials()), 0o600);
    let first = home.stored();
    assert_eq!(first["issuer"], issuer.as_str());
    let first_refresh = first["refresh_token"].as_str().unwrap().to_owned();

    let paused = as_signed_in()
        .args([
            "functions",
            "pause",
            "grant-bonus",
            "--reason",
            "sign-in test",
        ])
        .output()
        .unwrap();
    assert!(paused.status.success(), "{}", text(&paused));
    let logged: (String, String, String, String) = sqlx::query_as(
        "SELECT actor, actor_issuer, actor_subject, auth_method FROM ops_log \
         WHERE action = 'function.pause'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(
        logged,
        (
            "alice@example.com".to_owned(),
            issuer.clone(),
            "alice".to_owned(),
            "OIDC".to_owned()
        )
    );

    // An hour later: the call renews the token at the provider first, and keeps the new one.
    home.age_the_sign_in();
    let resumed = as_signed_in()
        .args(["functions", "resume", "grant-bonus"])
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", text(&resumed));
    let renewed = home.stored();
    assert_ne!(renewed["access_token"], first["access_token"]);
    let expires_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(renewed["expires_at"].clone()).unwrap();
    assert!(expires_at > chrono::Utc::now() + chrono::TimeDelta::minutes(5));
    assert_eq!(mode(&home.credentials()), 0o600);
    let resumed_by: String =
        sqlx::query_scalar("SELECT actor_subject FROM ops_log WHERE action = 'function.resume'")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert_eq!(resumed_by, "alice");

    let whoami = as_signed_in().arg("whoami").output().unwrap();
    let said = text(&whoami);
    assert!(whoami.status.success(), "{said}");
    assert!(
        said.contains("subject: alice") && said.contains(&issuer),
        "{said}"
    );
    let tokens = [
        first["access_token"].as_str().unwrap(),
        renewed["access_token"].as_str().unwrap(),
        renewed["refresh_token"].as_str().unwrap(),
        &first_refresh,
    ];
    for output in [&signed_in, &paused, &resumed, &whoami] {
        let printed = text(output);
        assert!(
            tokens.iter().all(|token| !printed.contains(token)),
            "a token was printed: {printed}"
        );
    }

    let kept = home.stored();
    let logout = as_signed_in().arg("logout").output().unwrap();
    assert!(logout.status.success(), "{}", text(&logout));
    assert!(!home.credentials().exists());
    let revoked = renew_at_provider(&api, kept["refresh_token"].as_str().unwrap()).await;
    assert_eq!(revoked["error"], "invalid_grant", "{revoked}");
    let after = as_signed_in()
        .args(["functions", "pause", "grant-bonus", "--reason", "x"])
        .output()
        .unwrap();
    assert_eq!(after.status.code(), Some(1));
    assert!(text(&after).contains("not signed in"), "{}", text(&after));

    // The revoked sign-in put back by hand: the renewal is refused, and the command says to
    // sign in again.
    std::fs::create_dir_all(home.0.join("paybus")).unwrap();
    std::fs::write(home.credentials(), kept.to_string()).unwrap();
    home.age_the_sign_in();
    let refused = as_signed_in()
        .args(["functions", "pause", "grant-bonus", "--reason", "x"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused).contains("invalid_grant") && text(&refused).contains("paybus login"),
        "{}",
        text(&refused)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_is_sent_to_no_other_api() {
    let env = TestEnv::new().await;
    let Some(api) = ApiProcess::with_provider(&env, &[]).await else {
        return;
    };
    let home = ConfigHome::new();
    assert!(login(&api, &env, &home, "alice").await.status.success());
    let mut stored = home.stored();
    stored["api"] = json!("https://paybus.example.com");
    std::fs::write(home.credentials(), stored.to_string()).unwrap();

    let elsewhere = api
        .cli(&env)
        .env("XDG_CONFIG_HOME", &home.0)
        .args(["functions", "resume", "grant-bonus"])
        .output()
        .unwrap();

    assert_eq!(elsewhere.status.code(), Some(1));
    assert!(
        text(&elsewhere).contains("signed in to https://paybus.example.com, not http://127.0.0.1:"),
        "{}",
        text(&elsewhere)
    );
}

#[tokio::test]
async fn login_against_an_api_that_names_no_provider_says_so() {
    let env = TestEnv::new().await;
    let api = ApiProcess::start(&env).await;
    let home = ConfigHome::new();

    let login = api
        .cli(&env)
        .env("XDG_CONFIG_HOME", &home.0)
        .args(["login", "--api", &api.base_url])
        .output()
        .unwrap();

    assert_eq!(login.status.code(), Some(1));
    assert!(
        text(&login).contains("names no OpenID provider"),
        "{}",
        text(&login)
    );
    assert!(!home.credentials().exists());
}
