//! Signing in to the console through the identity provider, against the real provider
//! (`paybus_testkit::oidc`): the console's redirect, the provider's own pages filled in as a
//! browser would, the callback delivered to the router with this browser's cookies. A person in no
//! mapped group is refused; one who may is given a server-side session (and never a token); a
//! state that is not the browser's, or a code used twice, opens nothing; idle and expired
//! sessions are over; signing out ends the session here and sends the browser to the
//! provider's sign-out; an ADMIN lists and ends another person's session.

use crate::support;

use std::collections::BTreeMap;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::ApiConfig;
use paybus_config::Secret;
use paybus_testkit::oidc::{self, OidcSetup};
use serde_json::Value;
use sha2::{Digest, Sha256};
use support::{Api, error_of};
use tower::ServiceExt;

/// Where the tests' browsers reach the console (nothing listens there: the provider's
/// redirect back is caught and delivered to the router).
const CONSOLE_URL: &str = "http://console.paybus.test";

/// The API with the provider's console client configured, as in production: `None` when the
/// provider's tools are missing (skipped).
async fn console_api(configure: impl FnOnce(&mut ApiConfig)) -> Option<Api> {
    Api::with_provider_setup(
        OidcSetup::default().console_redirect(
            &format!("{CONSOLE_URL}/console/callback"),
            &format!("{CONSOLE_URL}/console/login"),
        ),
        |config| {
            config.console.url = CONSOLE_URL.to_owned();
            config.console.client_secret = Some(Secret::new(oidc::CONSOLE_CLIENT_SECRET));
            configure(config);
        },
    )
    .await
}

/// What the router answered.
struct Answer {
    status: StatusCode,
    location: Option<String>,
    set_cookies: Vec<String>,
    body: String,
}

impl Answer {
    fn set_cookie(&self, name: &str) -> Option<&str> {
        self.set_cookies
            .iter()
            .find(|cookie| cookie.starts_with(&format!("{name}=")))
            .map(String::as_str)
    }
}

/// One browser: its cookies for the console, kept as a browser keeps them.
struct Browser<'a> {
    api: &'a Api,
    cookies: BTreeMap<String, String>,
}

impl<'a> Browser<'a> {
    fn new(api: &'a Api) -> Self {
        Self {
            api,
            cookies: BTreeMap::new(),
        }
    }

    async fn send(&mut self, mut request: Request<Body>) -> Answer {
        if !self.cookies.is_empty() {
            let jar = self
                .cookies
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect::<Vec<_>>()
                .join("; ");
            request
                .headers_mut()
                .insert(header::COOKIE, jar.parse().expect("a cookie header"));
        }
        let response = self
            .api
            .router()
            .oneshot(request)
            .await
            .expect("infallible");
        let set_cookies: Vec<String> = response
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect();
        for cookie in &set_cookies {
            let pair = cookie.split(';').next().unwrap_or_default();
            if let Some((name, value)) = pair.split_once('=') {
                if value.is_empty() || cookie.contains("Max-Age=0") {
                    self.cookies.remove(name);
                } else {
                    self.cookies.insert(name.to_owned(), value.to_owned());
                }
            }
        }
        let status = response.status();
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        Answer {
            status,
            location,
            set_cookies,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn get(&mut self, path: &str) -> Answer {
        self.send(Request::get(path).body(Body::empty()).expect("request"))
            .await
    }

    async fn post(&mut self, path: &str) -> Answer {
        self.send(
            Request::post(path)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::empty())
                .expect("request"),
        )
        .await
    }

    /// Clicks "Sign in with …": the provider's authorization URL the console sends us to.
    async fn start_sign_in(&mut self) -> String {
        let started = self.get("/console/sign-in").await;
        assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", started.body);
        started.location.expect("a redirect to the provider")
    }

    /// `user` on the provider's pages; the URL it sends the browser back to.
    async fn at_the_provider(&self, authorization_url: &str, user: &str) -> reqwest::Url {
        let provider = self.api.provider.as_ref().expect("a provider");
        let back = provider
            .authorize_code(authorization_url, user)
            .await
            .unwrap_or_else(|refused| panic!("{user} at the provider: {refused}"));
        assert!(
            back.as_str()
                .starts_with(&format!("{CONSOLE_URL}/console/callback?")),
            "{back}"
        );
        back
    }

    /// The provider's redirect back, delivered to the console.
    async fn come_back(&mut self, back: &reqwest::Url) -> Answer {
        self.get(&format!("/console/callback?{}", back.query().unwrap_or("")))
            .await
    }

    /// The whole sign-in of `user`: the callback's answer.
    async fn sign_in(&mut self, user: &str) -> Answer {
        let to = self.start_sign_in().await;
        let back = self.at_the_provider(&to, user).await;
        self.come_back(&back).await
    }

    fn session(&self) -> Option<&str> {
        self.cookies.get("paybus_console").map(String::as_str)
    }
}

fn query_of(url: &str) -> BTreeMap<String, String> {
    reqwest::Url::parse(url)
        .expect("a URL")
        .query_pairs()
        .into_owned()
        .collect()
}

async fn sessions(api: &Api) -> i64 {
    api.scalar("SELECT COUNT(*) FROM console_sessions").await
}

#[tokio::test]
async fn a_person_in_no_mapped_group_is_refused_at_sign_in_and_gets_no_session() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let mut browser = Browser::new(&api);

    let refused = browser.sign_in("carol").await;

    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(
        refused
            .body
            .contains("Signed in as carol@example.com, but your account has no paybus role"),
        "{}",
        refused.body
    );
    assert_eq!(refused.set_cookie("paybus_console"), None);
    assert_eq!(sessions(&api).await, 0);
    let overview = browser.get("/console/overview").await;
    assert_eq!(overview.location.as_deref(), Some("/console/login"));
}

#[tokio::test]
async fn a_person_signs_in_on_the_providers_pages_and_holds_a_session_not_a_token() {
    let Some(api) = console_api(|config| config.break_glass = false).await else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let mut browser = Browser::new(&api);

    let login = browser.get("/console/login").await;
    let to = browser.start_sign_in().await;
    let pending = browser
        .cookies
        .get("paybus_console_sign_in")
        .cloned()
        .expect("the sign-in's state cookie");
    let back = browser.at_the_provider(&to, "alice").await;
    let signed_in = browser.come_back(&back).await;

    assert!(
        login.body.contains("Sign in with 127.0.0.1"),
        "{}",
        login.body
    );
    assert!(!login.body.contains("Break-glass token"), "{}", login.body);
    let discovery = provider.discovery().await;
    let authorization_endpoint = discovery["authorization_endpoint"].as_str().expect("it");
    assert!(to.starts_with(authorization_endpoint), "{to}");
    let asked = query_of(&to);
    for (name, value) in [
        ("response_type", "code"),
        ("client_id", oidc::CONSOLE_CLIENT_ID),
        (
            "redirect_uri",
            "http://console.paybus.test/console/callback",
        ),
        ("scope", "openid email profile groups"),
        ("resource", oidc::DEFAULT_AUDIENCE),
        ("code_challenge_method", "S256"),
    ] {
        assert_eq!(asked.get(name).map(String::as_str), Some(value), "{name}");
    }
    assert_eq!(asked["state"], pending);
    assert_eq!(asked["code_challenge"].len(), 43);
    assert_ne!(asked["nonce"], asked["state"]);

    assert_eq!(
        signed_in.status,
        StatusCode::SEE_OTHER,
        "{}",
        signed_in.body
    );
    assert_eq!(signed_in.location.as_deref(), Some("/console"));
    let cookie = signed_in
        .set_cookie("paybus_console")
        .expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/console", "Max-Age=43200"] {
        assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
    }
    let cleared = signed_in
        .set_cookie("paybus_console_sign_in")
        .expect("the state cleared");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    let secret = browser.session().expect("a session").to_owned();
    assert!(
        !secret.contains('.'),
        "a random secret, not a JWT: {secret}"
    );
    let row: (Vec<u8>, String, String, String, String, String) = sqlx::query_as(
        "SELECT secret_sha256, issuer, subject, name, auth_method, roles FROM console_sessions",
    )
    .fetch_one(&api.env.db)
    .await
    .expect("one session");
    assert_eq!(row.0, Sha256::digest(secret.as_bytes()).to_vec());
    assert_eq!(
        (
            row.1,
            row.2.as_str(),
            row.3.as_str(),
            row.4.as_str(),
            row.5.as_str()
        ),
        (
            provider.issuer(),
            "alice",
            "alice@example.com",
            "OIDC",
            "ADMIN"
        )
    );
    let overview = browser.get("/console/overview").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    assert!(overview.body.contains("alice@example.com (ADMIN)"));
    assert!(!overview.body.contains(&secret));
}

#[tokio::test]
async fn behind_https_the_cookies_are_secure() {
    const HTTPS: &str = "https://console.paybus.test";
    let Some(api) = Api::with_provider_setup(
        OidcSetup::default().console_redirect(
            &format!("{HTTPS}/console/callback"),
            &format!("{HTTPS}/console/login"),
        ),
        |config| {
            config.console.url = HTTPS.to_owned();
            config.console.client_secret = Some(Secret::new(oidc::CONSOLE_CLIENT_SECRET));
        },
    )
    .await
    else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let mut browser = Browser::new(&api);

    let started = browser.get("/console/sign-in").await;
    let to = started.location.clone().expect("to the provider");
    let back = provider.authorize_code(&to, "dave").await.expect("dave");
    let signed_in = browser
        .get(&format!("/console/callback?{}", back.query().unwrap_or("")))
        .await;

    let pending = started
        .set_cookie("paybus_console_sign_in")
        .expect("the state cookie");
    assert!(pending.ends_with("; Secure"), "{pending}");
    assert_eq!(
        signed_in.status,
        StatusCode::SEE_OTHER,
        "{}",
        signed_in.body
    );
    let session = signed_in.set_cookie("paybus_console").expect("a session");
    assert!(session.ends_with("; Secure"), "{session}");
}

#[tokio::test]
async fn a_state_that_is_not_the_browsers_is_refused_before_the_code_is_used() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let mut browser = Browser::new(&api);
    let to = browser.start_sign_in().await;
    let back = browser.at_the_provider(&to, "alice").await;
    let returned = query_of(back.as_str());
    let code = &returned["code"];
    let state = &returned["state"];

    // The code with another state; then the right state from a browser that did not start
    // this sign-in (no cookie: a forged link sent to someone else).
    let tampered = browser
        .get(&format!("/console/callback?code={code}&state={state}x"))
        .await;
    let mut elsewhere = Browser::new(&api);
    let stranger = elsewhere
        .get(&format!("/console/callback?code={code}&state={state}"))
        .await;

    for refused in [&tampered, &stranger] {
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
        assert!(
            refused.body.contains("not started in this browser"),
            "{}",
            refused.body
        );
        assert_eq!(refused.set_cookie("paybus_console"), None);
    }
    assert_eq!(sessions(&api).await, 0);
    // The code was never sent to the provider: the browser that started the sign-in may
    // still complete it (its state cookie, cleared by the refusal, put back as it was).
    browser
        .cookies
        .insert("paybus_console_sign_in".to_owned(), state.clone());
    let completed = browser.come_back(&back).await;
    assert_eq!(
        completed.status,
        StatusCode::SEE_OTHER,
        "{}",
        completed.body
    );
    assert_eq!(sessions(&api).await, 1);
}

#[tokio::test]
async fn a_code_used_twice_opens_nothing_the_second_time() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let mut browser = Browser::new(&api);
    let to = browser.start_sign_in().await;
    let state = browser
        .cookies
        .get("paybus_console_sign_in")
        .cloned()
        .expect("the state cookie");
    let back = browser.at_the_provider(&to, "alice").await;
    let first = browser.come_back(&back).await;
    assert_eq!(first.status, StatusCode::SEE_OTHER, "{}", first.body);

    // The same answer again, with the state cookie an attacker copied: the provider refuses
    // the code it already exchanged.
    let mut replay = Browser::new(&api);
    replay
        .cookies
        .insert("paybus_console_sign_in".to_owned(), state);
    let second = replay.come_back(&back).await;
    // The browser's own history: its state cookie is gone after the first use.
    let again = browser.come_back(&back).await;

    assert_eq!(second.status, StatusCode::UNAUTHORIZED, "{}", second.body);
    assert!(
        second.body.contains("refused this sign-in's code"),
        "{}",
        second.body
    );
    assert_eq!(second.set_cookie("paybus_console"), None);
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "{}", again.body);
    assert_eq!(sessions(&api).await, 1);
}

#[tokio::test]
async fn an_idle_or_expired_session_sends_the_browser_to_the_login_page() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let mut browser = Browser::new(&api);
    browser.sign_in("dave").await;
    let last_seen = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT TIMESTAMPDIFF(SECOND, last_seen_at, NOW(6)) FROM console_sessions",
        )
        .fetch_one(&api.env.db)
        .await
        .expect("last seen")
    };

    // Seen 20 minutes ago: within the 30-minute idle timeout; the page marks it seen now.
    sqlx::query("UPDATE console_sessions SET last_seen_at = NOW(6) - INTERVAL 20 MINUTE")
        .execute(&api.env.db)
        .await
        .expect("age the session");
    let active = browser.get("/console/overview").await;
    assert_eq!(active.status, StatusCode::OK, "{}", active.body);
    assert!(last_seen().await < 5, "touched by the request");
    // Seen 30 s ago: not written again (at most once a minute).
    sqlx::query("UPDATE console_sessions SET last_seen_at = NOW(6) - INTERVAL 30 SECOND")
        .execute(&api.env.db)
        .await
        .expect("age the session");
    assert_eq!(browser.get("/console/jobs").await.status, StatusCode::OK);
    assert!(last_seen().await >= 29, "not written within the minute");

    // Idle for 31 minutes: over.
    sqlx::query("UPDATE console_sessions SET last_seen_at = NOW(6) - INTERVAL 31 MINUTE")
        .execute(&api.env.db)
        .await
        .expect("idle the session");
    let idle = browser.get("/console/overview").await;
    assert_eq!(idle.status, StatusCode::SEE_OTHER);
    assert_eq!(
        idle.location.as_deref(),
        Some("/console/login?session=over")
    );

    // A new session, active a moment ago, past its expiry: over too.
    browser.sign_in("dave").await;
    sqlx::query(
        "UPDATE console_sessions SET expires_at = NOW(6) - INTERVAL 1 SECOND \
         WHERE ended_at IS NULL AND last_seen_at > NOW(6) - INTERVAL 1 MINUTE",
    )
    .execute(&api.env.db)
    .await
    .expect("expire the session");
    let expired = browser.get("/console/overview").await;
    assert_eq!(expired.status, StatusCode::SEE_OTHER);
    assert_eq!(
        expired.location.as_deref(),
        Some("/console/login?session=over")
    );
    let login = browser.get("/console/login?session=over").await;
    assert!(
        login.body.contains("Your session is over"),
        "{}",
        login.body
    );
}

#[tokio::test]
async fn signing_out_ends_the_session_here_and_at_the_provider() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let mut browser = Browser::new(&api);
    browser.sign_in("alice").await;
    let old_cookie = browser.session().expect("a session").to_owned();

    let signed_out = browser.post("/console/logout").await;

    assert_eq!(
        signed_out.status,
        StatusCode::SEE_OTHER,
        "{}",
        signed_out.body
    );
    let to = signed_out.location.clone().expect("a redirect");
    let discovery = provider.discovery().await;
    let end_session = discovery["end_session_endpoint"].as_str().expect("one");
    assert!(to.starts_with(end_session), "{to}");
    let asked = query_of(&to);
    assert_eq!(asked["client_id"], oidc::CONSOLE_CLIENT_ID);
    assert_eq!(
        asked["post_logout_redirect_uri"],
        "http://console.paybus.test/console/login"
    );
    let cleared = signed_out.set_cookie("paybus_console").expect("cleared");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    let ended: (Option<String>, String) = sqlx::query_as(
        "SELECT ended_by, ended_by_subject FROM console_sessions WHERE ended_at IS NOT NULL",
    )
    .fetch_one(&api.env.db)
    .await
    .expect("the session ended");
    assert_eq!(
        ended,
        (Some("alice@example.com".to_owned()), "alice".to_owned())
    );
    // The old cookie, presented again (copied before signing out): the login page.
    let mut copied = Browser::new(&api);
    copied
        .cookies
        .insert("paybus_console".to_owned(), old_cookie);
    let after = copied.get("/console/overview").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    assert_eq!(
        after.location.as_deref(),
        Some("/console/login?session=over")
    );
}

#[tokio::test]
async fn an_admin_lists_the_sessions_and_ends_another_persons() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let mut alice = Browser::new(&api);
    alice.sign_in("alice").await;
    let mut dave = Browser::new(&api);
    dave.sign_in("dave").await;
    let call = |method: &str, path: &str, user: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header(
                header::AUTHORIZATION,
                format!("Bearer {}", api.person(user)),
            )
            .body(Body::empty())
            .expect("request")
    };

    // OPS may read the console, not who is signed in to it.
    let (ops_status, ops_body) = api
        .call(call("GET", "/v1/admin/console-sessions", "dave"))
        .await;
    let dave_page = dave.get("/console/sessions").await;
    let (status, list) = api
        .call(call("GET", "/v1/admin/console-sessions", "bob"))
        .await;
    let page = alice.get("/console/sessions").await;

    assert_eq!(ops_status, StatusCode::FORBIDDEN, "{ops_body}");
    assert_eq!(error_of(&ops_body), "this request needs the ADMIN role");
    assert_eq!(dave_page.status, StatusCode::FORBIDDEN);
    assert!(
        !dave
            .get("/console/overview")
            .await
            .body
            .contains("href=\"/console/sessions\"")
    );
    assert_eq!(status, StatusCode::OK, "{list}");
    let listed = list["sessions"].as_array().expect("sessions");
    let subjects: Vec<&str> = listed
        .iter()
        .filter_map(|s| s["subject"].as_str())
        .collect();
    assert_eq!(subjects, ["dave", "alice"], "newest first: {list}");
    let dave_session = listed[0]["id"].as_str().expect("an id").to_owned();
    assert_eq!(listed[0]["issuer"], provider.issuer());
    assert_eq!(listed[0]["roles"], serde_json::json!(["OPS"]));
    assert_eq!(listed[0]["auth_method"], "OIDC");
    assert!(listed[0].get("secret_sha256").is_none());
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body
            .contains(&format!("data-id=\"{dave_session}\" data-subject=\"dave\"")),
        "{}",
        page.body
    );

    // Alice ends Dave's session from the console.
    let ended = alice
        .post(&format!("/console/sessions/{dave_session}/end"))
        .await;

    assert_eq!(ended.status, StatusCode::OK, "{}", ended.body);
    assert!(
        ended.body.contains("The session of dave@example.com"),
        "{}",
        ended.body
    );
    let after = dave.get("/console/overview").await;
    assert_eq!(
        after.location.as_deref(),
        Some("/console/login?session=over")
    );
    let entries = api.ops_log().await;
    let entry = &entries[0];
    assert_eq!(entry["action"], "console_session.end");
    assert_eq!(entry["subject"], format!("console_session:{dave_session}"));
    assert_eq!(entry["actor"], "alice@example.com");
    assert_eq!(entry["actor_issuer"], provider.issuer());
    assert_eq!(entry["actor_subject"], "alice");
    let detail: Value = match &entry["detail"] {
        Value::String(text) => serde_json::from_str(text).expect("JSON"),
        other => other.clone(),
    };
    assert_eq!(detail["subject"], "dave");
    let (again, body) = api
        .call(call(
            "POST",
            &format!("/v1/admin/console-sessions/{dave_session}/end"),
            "bob",
        ))
        .await;
    assert_eq!(again, StatusCode::CONFLICT, "{body}");
    let (unknown, _) = api
        .call(call(
            "POST",
            &format!("/v1/admin/console-sessions/{}/end", uuid::Uuid::new_v4()),
            "bob",
        ))
        .await;
    assert_eq!(unknown, StatusCode::NOT_FOUND);
    let (garbage, _) = api
        .call(call("POST", "/v1/admin/console-sessions/nope/end", "bob"))
        .await;
    assert_eq!(garbage, StatusCode::BAD_REQUEST);
    let (_, list) = api
        .call(call("GET", "/v1/admin/console-sessions", "bob"))
        .await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1), "{list}");
}

#[tokio::test]
async fn console_actions_act_as_the_signed_in_person() {
    let Some(api) = console_api(|config| {
        config.four_eyes = paybus_ops::approvals::FourEyes::off();
    })
    .await
    else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let mut alice = Browser::new(&api);
    alice.sign_in("alice").await;

    let paused = alice
        .send(
            Request::post("/console/functions/grant-bonus/pause")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from("reason=incident"))
                .expect("request"),
        )
        .await;

    assert_eq!(paused.status, StatusCode::OK, "{}", paused.body);
    assert!(
        paused.body.contains("grant-bonus paused"),
        "{}",
        paused.body
    );
    let entries = api.ops_log().await;
    assert_eq!(entries[0]["action"], "function.pause", "{entries:?}");
    assert_eq!(entries[0]["actor"], "alice@example.com");
    assert_eq!(entries[0]["actor_issuer"], provider.issuer());
    assert_eq!(entries[0]["actor_subject"], "alice");
    assert_eq!(entries[0]["auth_method"], "OIDC");
}

#[tokio::test]
async fn an_id_token_counts_only_for_the_console_and_the_sign_in_it_was_minted_for() {
    let Some(api) = console_api(|_| {}).await else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let verifier = api.state.oidc.clone().expect("a verifier");
    let now = support::now() as u64;
    let id_token = |change: &dyn Fn(&mut Value)| {
        let mut claims = serde_json::json!({
            "iss": provider.issuer(), "sub": "alice", "aud": oidc::CONSOLE_CLIENT_ID,
            "exp": now + 600, "iat": now, "nonce": "the-sign-in's-nonce",
        });
        change(&mut claims);
        provider.sign(claims)
    };
    let verify = |token: String| {
        let verifier = verifier.clone();
        async move {
            verifier
                .verify_id_token(&token, oidc::CONSOLE_CLIENT_ID, "the-sign-in's-nonce")
                .await
        }
    };
    use paybus_api::oidc::Refused;

    let good = verify(id_token(&|_| {})).await;

    assert_eq!(good.map(|id| id.subject), Ok("alice".to_owned()));
    for (case, change, expected) in [
        (
            "another sign-in's nonce",
            &(|c: &mut Value| c["nonce"] = "another".into()) as &dyn Fn(&mut Value),
            Refused::Invalid,
        ),
        (
            "no nonce",
            &|c: &mut Value| c["nonce"] = Value::Null,
            Refused::Invalid,
        ),
        (
            "another client's",
            &|c: &mut Value| c["aud"] = oidc::CLI_CLIENT_ID.into(),
            Refused::NotForUs,
        ),
        (
            "several audiences, another client authorized",
            &|c: &mut Value| {
                c["aud"] = serde_json::json!([oidc::CONSOLE_CLIENT_ID, "other"]);
                c["azp"] = "other".into();
            },
            Refused::NotForUs,
        ),
        (
            "another issuer's",
            &|c: &mut Value| c["iss"] = "https://elsewhere.example".into(),
            Refused::NotForUs,
        ),
        (
            "expired",
            &|c: &mut Value| c["exp"] = (now - 120).into(),
            Refused::Expired,
        ),
    ] {
        assert_eq!(
            verify(id_token(change)).await.map(|id| id.subject),
            Err(expected),
            "{case}"
        );
    }
    let claims = serde_json::json!({
        "iss": provider.issuer(), "sub": "alice", "aud": oidc::CONSOLE_CLIENT_ID,
        "exp": now + 600, "iat": now, "nonce": "the-sign-in's-nonce",
    });
    assert_eq!(
        verify(provider.sign_with_unknown_key(claims.clone()))
            .await
            .map(|id| id.subject),
        Err(Refused::UnknownKey)
    );
    assert_eq!(
        verify(provider.sign_hs256_with_public_key(claims))
            .await
            .map(|id| id.subject),
        Err(Refused::Algorithm)
    );
}
