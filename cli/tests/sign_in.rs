//! A person's sign-in as the command line keeps it: an access token that expired is renewed
//! with the refresh token before the call (the new tokens stored 0600 in a 0700 folder, the
//! call made as the person), `whoami` reads whom the token names, `logout` revokes the refresh
//! token at the provider and deletes the file; a sign-in is never sent to another API; and
//! `login` against an API that names no provider says so.
//!
//! The provider here is a small real HTTP server (discovery, token and revocation endpoints)
//! that issues the API's break-glass tokens: the API accepts no provider's token yet. The
//! device flow's polling is tested against a real local server in `cli/src/oidc.rs`.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod api_process;

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Output,
    sync::{Arc, Mutex},
};

use api_process::ApiProcess;
use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    routing::{get, post},
};
use paybus_platform::testing::TestEnv;
use serde_json::{Value, json};

const CLIENT_ID: &str = "paybus-cli";
const AUDIENCE: &str = "urn:paybus:admin-api";
const FIRST_REFRESH_TOKEN: &str = "refresh-token-1";
const SECOND_REFRESH_TOKEN: &str = "refresh-token-2";

/// A form as the provider received it, field by field.
type Form = Vec<(String, String)>;

/// The provider's side: it renews `refresh-token-1` once, for the API's audience, with
/// `access_token`, and records every form it is sent.
#[derive(Clone)]
struct Provider {
    issuer: String,
    access_token: String,
    token_requests: Arc<Mutex<Vec<Form>>>,
    revocations: Arc<Mutex<Vec<Form>>>,
}

fn form(body: &str) -> Form {
    url::form_urlencoded::parse(body.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn field<'a>(form: &'a [(String, String)], name: &str) -> Option<&'a str> {
    form.iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

async fn discovery(State(provider): State<Provider>) -> Json<Value> {
    let issuer = &provider.issuer;
    Json(json!({
        "issuer": issuer,
        "token_endpoint": format!("{issuer}/token"),
        "device_authorization_endpoint": format!("{issuer}/device/auth"),
        "revocation_endpoint": format!("{issuer}/token/revocation"),
    }))
}

async fn token(State(provider): State<Provider>, body: String) -> (StatusCode, Json<Value>) {
    let request = form(&body);
    provider
        .token_requests
        .lock()
        .unwrap()
        .push(request.clone());
    let renews = field(&request, "grant_type") == Some("refresh_token")
        && field(&request, "refresh_token") == Some(FIRST_REFRESH_TOKEN)
        && field(&request, "client_id") == Some(CLIENT_ID)
        && field(&request, "resource") == Some(AUDIENCE);
    if !renews {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant"})),
        );
    }
    (
        StatusCode::OK,
        Json(json!({
            "access_token": provider.access_token,
            "refresh_token": SECOND_REFRESH_TOKEN,
            "token_type": "Bearer",
            "expires_in": 600,
        })),
    )
}

async fn revocation(State(provider): State<Provider>, body: String) -> StatusCode {
    provider.revocations.lock().unwrap().push(form(&body));
    StatusCode::OK
}

impl Provider {
    async fn start(access_token: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let provider = Provider {
            issuer: format!("http://{}", listener.local_addr().unwrap()),
            access_token,
            token_requests: Arc::default(),
            revocations: Arc::default(),
        };
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/token", post(token))
            .route("/token/revocation", post(revocation))
            .with_state(provider.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        provider
    }
}

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

    /// A sign-in as `paybus login` leaves it, but world-readable in a world-readable folder
    /// (as a hand copy might leave it), and its access token expired a minute ago.
    fn plant_expired_sign_in(&self, api: &str, issuer: &str) {
        let folder = self.0.join("paybus");
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        let credentials = json!({
            "api": api,
            "issuer": issuer,
            "client_id": CLIENT_ID,
            "audience": AUDIENCE,
            "access_token": "an-access-token-that-expired",
            "refresh_token": FIRST_REFRESH_TOKEN,
            "expires_at": (chrono::Utc::now() - chrono::TimeDelta::minutes(1)).to_rfc3339(),
        });
        std::fs::write(self.credentials(), credentials.to_string()).unwrap();
        std::fs::set_permissions(self.credentials(), std::fs::Permissions::from_mode(0o644))
            .unwrap();
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

// The provider answers on the runtime while the test waits for `paybus` in a blocking call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_sign_in_is_renewed_with_its_refresh_token_stored_privately_and_revoked_at_logout()
 {
    let env = TestEnv::new().await;
    let api = ApiProcess::start(&env).await;
    let renewed_token = api.token_of("alice", &["ADMIN"]);
    let provider = Provider::start(renewed_token.clone()).await;
    let home = ConfigHome::new();
    home.plant_expired_sign_in(&api.base_url, &provider.issuer);
    let as_signed_in = || {
        let mut command = api.cli(&env);
        command.env("XDG_CONFIG_HOME", &home.0);
        command
    };

    let paused = as_signed_in()
        .args([
            "functions",
            "pause",
            "grant-bonus",
            "--reason",
            "renewal test",
        ])
        .output()
        .unwrap();

    assert!(paused.status.success(), "{}", text(&paused));
    let requests = provider.token_requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1, "one renewal: {requests:?}");
    let paused_by: String =
        sqlx::query_scalar("SELECT paused_by FROM function_pauses WHERE function_name = ?")
            .bind("grant-bonus")
            .fetch_one(&env.db)
            .await
            .unwrap();
    assert!(paused_by.contains("alice"), "{paused_by}");
    let stored = home.stored();
    assert_eq!(stored["access_token"], renewed_token.as_str());
    assert_eq!(stored["refresh_token"], SECOND_REFRESH_TOKEN);
    let expires_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(stored["expires_at"].clone()).unwrap();
    assert!(expires_at > chrono::Utc::now() + chrono::TimeDelta::minutes(9));
    assert_eq!(mode(&home.0.join("paybus")), 0o700);
    assert_eq!(mode(&home.credentials()), 0o600);

    // Renewed once: the next call sends the stored token as it is.
    let resumed = as_signed_in()
        .args(["functions", "resume", "grant-bonus"])
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(provider.token_requests.lock().unwrap().len(), 1);

    let whoami = as_signed_in().arg("whoami").output().unwrap();
    let said = text(&whoami);
    assert!(whoami.status.success(), "{said}");
    assert!(said.contains("subject: alice"), "{said}");
    assert!(said.contains("without verifying it"), "{said}");
    for output in [&paused, &resumed, &whoami] {
        let printed = text(output);
        assert!(
            !printed.contains(&renewed_token) && !printed.contains(SECOND_REFRESH_TOKEN),
            "a token was printed: {printed}"
        );
    }

    let logout = as_signed_in().arg("logout").output().unwrap();
    assert!(logout.status.success(), "{}", text(&logout));
    let revocations = provider.revocations.lock().unwrap().clone();
    assert_eq!(revocations.len(), 1);
    assert_eq!(
        field(&revocations[0], "token"),
        Some(SECOND_REFRESH_TOKEN),
        "{revocations:?}"
    );
    assert_eq!(field(&revocations[0], "client_id"), Some(CLIENT_ID));
    assert!(!home.credentials().exists());
    let after = as_signed_in()
        .args(["functions", "pause", "grant-bonus", "--reason", "x"])
        .output()
        .unwrap();
    assert_eq!(after.status.code(), Some(1));
    assert!(text(&after).contains("not signed in"), "{}", text(&after));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_is_sent_to_no_other_api_and_a_refused_renewal_asks_to_sign_in_again() {
    let env = TestEnv::new().await;
    let api = ApiProcess::start(&env).await;
    let provider = Provider::start(api.token_of("alice", &["ADMIN"])).await;
    let home = ConfigHome::new();
    home.plant_expired_sign_in("https://paybus.example.com", &provider.issuer);

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
    assert!(provider.token_requests.lock().unwrap().is_empty());

    home.plant_expired_sign_in(&api.base_url, &provider.issuer);
    let mut stored = home.stored();
    stored["refresh_token"] = json!("a-refresh-token-the-provider-forgot");
    std::fs::write(home.credentials(), stored.to_string()).unwrap();
    let refused = api
        .cli(&env)
        .env("XDG_CONFIG_HOME", &home.0)
        .args(["functions", "resume", "grant-bonus"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused).contains("invalid_grant") && text(&refused).contains("paybus login"),
        "{}",
        text(&refused)
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
