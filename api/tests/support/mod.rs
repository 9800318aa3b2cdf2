//! The API tests' harness: a fresh database and vhost per test (`TestEnv`), the services the
//! API runs on with both secrets configured, and requests driven through the router with
//! `oneshot`.
#![allow(dead_code)] // each test binary uses its own part of the harness

use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::{ApiConfig, AppState, auth, role::Role, router};
use paybus_bus::Services;
use paybus_config::{Secret, signature};
use paybus_testkit::{
    TestEnv,
    oidc::{self, OidcProvider, OidcSetup},
    queue_depth,
};
use serde_json::Value;
use tower::ServiceExt;

pub const MONITOR_SECRET: &str = "chain-monitor-secret-for-tests";
/// The payment service's signing secret in tests.
pub const PAYMENTS_SECRET: &str = "payment-service-secret-for-tests";
/// The key the tests' admin role tokens are signed with.
pub const ADMIN_JWT_SECRET: &str = "admin-jwt-secret-for-tests-0123456789";
/// The server key partner API keys are hashed under in tests.
pub const PARTNER_KEY_HASH_KEY: &str = "partner-key-hash-key-for-tests-0123456789";

/// A token with `roles`, valid for an hour.
pub fn token(roles: &[Role]) -> String {
    auth::issue(
        ADMIN_JWT_SECRET,
        "tests",
        roles,
        std::time::Duration::from_secs(3600),
    )
    .expect("mint a test token")
}

/// An ADMIN token.
pub fn admin_token() -> String {
    token(&[Role::Admin])
}

pub const WITHDRAWAL_CONFIRMATIONS: &str = "/v1/chain-monitor/withdrawal-confirmations";
pub const DEPOSIT_CONFIRMATIONS: &str = "/v1/chain-monitor/deposit-confirmations";

/// Fields drop in order: the services' pool and connection go before the test database.
pub struct Api {
    pub config: ApiConfig,
    pub state: AppState,
    pub services: Services,
    pub env: TestEnv,
    /// The identity provider people sign in with (`with_provider`), when the test has one.
    pub provider: Option<std::sync::Arc<OidcProvider>>,
}

impl Api {
    /// Intake, payments and admin API enabled.
    pub async fn new() -> Self {
        Self::with(|_| {}).await
    }

    /// [`new`](Self::new) with four-eyes off: one ADMIN acts alone (tests about the actions
    /// themselves; four-eyes has its own tests).
    pub async fn without_four_eyes() -> Self {
        Self::with(|config| config.four_eyes = paybus_ops::approvals::FourEyes::off()).await
    }

    /// [`new`](Self::new) with a real identity provider (`paybus_testkit::oidc`): people — alice
    /// and bob (ADMIN), dave (OPS), carol (no role) — call with [`person`](Self::person)'s tokens.
    /// `None` when the provider's tools are missing (the test is skipped; see `OidcProvider`).
    pub async fn with_provider(configure: impl FnOnce(&mut ApiConfig)) -> Option<Self> {
        Self::with_provider_setup(OidcSetup::default(), configure).await
    }

    /// [`with_provider`](Self::with_provider) with the provider started on `setup` (e.g. the
    /// console's client registered: `OidcSetup::console_redirect`).
    pub async fn with_provider_setup(
        setup: OidcSetup,
        configure: impl FnOnce(&mut ApiConfig),
    ) -> Option<Self> {
        let provider = OidcProvider::start(setup).await?;
        let mut api = Self::with(|config| {
            config.oidc = Some(paybus_api::oidc::OidcConfig {
                issuer: provider.issuer(),
                audience: provider.audience().to_owned(),
                roles_claim: "groups".to_owned(),
                admin_values: vec![oidc::ADMINS_GROUP.to_owned()],
                ops_values: vec![oidc::OPS_GROUP.to_owned()],
                cli_client_id: oidc::CLI_CLIENT_ID.to_owned(),
            });
            configure(config);
        })
        .await;
        api.provider = Some(std::sync::Arc::new(provider));
        Some(api)
    }

    /// An access token of `user` (see [`with_provider`](Self::with_provider)), signed with the
    /// provider's key as its own tokens are.
    pub fn person(&self, user: &str) -> String {
        let provider = self.provider.as_ref().expect("an API made with_provider");
        provider.sign(provider.claims_for(user))
    }

    /// An ADMIN's token for `subject`: a person the provider vouches for, in the ADMIN group,
    /// when the API has one (`with_provider`); else a break-glass token (four-eyes refuses
    /// those).
    pub fn admin(&self, subject: &str) -> String {
        admin_token_of(self.provider.as_deref(), subject)
    }

    /// The issuer and subject `user`'s token names.
    pub fn identity_of(&self, user: &str) -> (String, String) {
        let provider = self.provider.as_ref().expect("an API made with_provider");
        (provider.issuer(), user.to_owned())
    }

    /// Secrets set, then `configure` may change the API's settings (e.g. unset one).
    pub async fn with(configure: impl FnOnce(&mut ApiConfig)) -> Self {
        let env = TestEnv::new().await;
        let mut config = ApiConfig {
            chain_monitor_secret: Some(Secret::new(MONITOR_SECRET)),
            admin_jwt_secret: Some(Secret::new(ADMIN_JWT_SECRET)),
            // The tests' tokens are break-glass ones (`token`); four-eyes, which needs people
            // the provider vouches for, runs with `with_provider`'s.
            break_glass: true,
            payments_secret: Some(Secret::new(PAYMENTS_SECRET)),
            partner_api: paybus_api::partner_api::PartnerApiConfig {
                key_hash_key: Some(Secret::new(PARTNER_KEY_HASH_KEY)),
                ..Default::default()
            },
            sealer: Some(paybus_testkit::sealer()),
            ..ApiConfig::default()
        };
        configure(&mut config);
        let services = env.services(&[]).await;
        Self {
            state: AppState::new(&services, &config, paybus_catalog::audit_checks())
                .expect("build the API state")
                .with_functions(paybus_catalog::FUNCTIONS),
            config,
            services,
            env,
            provider: None,
        }
    }

    pub fn router(&self) -> Router {
        router(self.state.clone())
    }

    /// Sends one request through a fresh router; the status and the JSON body (Null if empty, a
    /// string if the answer is not JSON).
    pub async fn call(&self, request: Request<Body>) -> (StatusCode, Value) {
        let response = self.router().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("read the body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            // `/metrics` answers text: kept as a JSON string, so callers can still read it.
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, body)
    }

    /// The ops log as OPS read it (`GET /v1/admin/ops-log`), newest first.
    pub async fn ops_log(&self) -> Vec<Value> {
        let (status, page) = self
            .call(with_roles("GET", "/v1/admin/ops-log", &[Role::Ops]))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["entries"].as_array().expect("entries").clone()
    }

    /// (actor, action, subject) of each ops log entry, newest first.
    pub async fn ops_actions(&self) -> Vec<(String, String, String)> {
        self.ops_log()
            .await
            .iter()
            .map(|entry| {
                let text = |field: &str| entry[field].as_str().unwrap_or_default().to_owned();
                (text("actor"), text("action"), text("subject"))
            })
            .collect()
    }

    /// A partner created through the admin API.
    pub async fn partner(&self, name: &str) -> u64 {
        let (status, answer) = self
            .call(admin_post(
                "/v1/admin/partners",
                &serde_json::json!({"name": name, "webhook_secret": "partner-signing-secret-0001"}),
            ))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        answer["id"].as_u64().expect("partner id")
    }

    /// A new API key of `partner_id` (`pbk_…`), created by an ADMIN.
    pub async fn partner_key(&self, partner_id: u64) -> String {
        let (status, answer) = self
            .call(admin_post(
                &format!("/v1/admin/partners/{partner_id}/api-keys"),
                &serde_json::json!({"label": "tests"}),
            ))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        answer["key"].as_str().expect("the key").to_owned()
    }

    pub async fn scalar(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.env.db)
            .await
            .expect("query")
    }
}

/// An expected ops log entry: (actor, action, subject).
pub fn logged(actor: &str, action: &str, subject: &str) -> (String, String, String) {
    (actor.to_owned(), action.to_owned(), subject.to_owned())
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

/// A POST with `body` signed by `secret` at `timestamp`.
pub fn signed_at(path: &str, body: &str, secret: &str, timestamp: i64) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            signature::HEADER,
            signature::sign(secret.as_bytes(), timestamp, body.as_bytes()),
        )
        .body(Body::from(body.to_owned()))
        .expect("request")
}

/// A POST signed the way the chain monitor does, now.
pub fn signed(path: &str, body: &str) -> Request<Body> {
    signed_at(path, body, MONITOR_SECRET, now())
}

pub fn unsigned(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .expect("request")
}

pub fn admin_post(path: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", admin_token()))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

/// A partner API POST with `key`.
pub fn partner_post(path: &str, key: &str, body: &Value) -> Request<Body> {
    Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

/// A partner API GET with `key`.
pub fn partner_get(path: &str, key: &str) -> Request<Body> {
    Request::get(path)
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .body(Body::empty())
        .expect("request")
}

/// `paybus_console=<secret>` of a break-glass console session with `roles`, opened with the
/// login page's token form (the API's break-glass is on).
pub async fn console_cookie(api: &Api, roles: &[Role]) -> String {
    let opened = api
        .router()
        .oneshot(
            Request::post("/console/login")
                .header(
                    axum::http::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(Body::from(format!("token={}", token(roles))))
                .expect("request"),
        )
        .await
        .expect("infallible");
    opened.headers()[axum::http::header::SET_COOKIE]
        .to_str()
        .expect("a cookie")
        .split(';')
        .next()
        .expect("its value")
        .to_owned()
}

pub fn admin_get(path: &str) -> Request<Body> {
    Request::get(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", admin_token()))
        .body(Body::empty())
        .expect("request")
}

/// A request with a token carrying `roles` (and no body).
pub fn with_roles(method: &str, path: &str, roles: &[Role]) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", token(roles)))
        .body(Body::empty())
        .expect("request")
}

/// The `error` field of an error answer.
pub fn error_of(body: &Value) -> &str {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field in {body}"))
}

/// Messages waiting in the tap, polled until `expected` arrive or 5 s pass.
pub async fn tap_count(channel: &lapin::Channel, name: &str, expected: u32) -> u32 {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let count = queue_depth(channel, name).await;
        if count >= expected || tokio::time::Instant::now() > deadline {
            return count;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The API on a real socket, so concurrent requests are concurrent connections, handlers and
/// transactions; stops when dropped.
pub struct Served {
    base: String,
    client: reqwest::Client,
    shutdown: tokio_util::sync::CancellationToken,
    provider: Option<std::sync::Arc<OidcProvider>>,
}

impl Served {
    pub async fn start(api: &Api) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let shutdown = tokio_util::sync::CancellationToken::new();
        tokio::spawn(paybus_api::server::serve_on(
            listener,
            api.state.clone(),
            paybus_api::server::Limits::default(),
            shutdown.clone(),
        ));
        Self {
            base,
            client: reqwest::Client::new(),
            shutdown,
            provider: api.provider.clone(),
        }
    }

    /// Every `(admin, path)` POSTed with `body` at once, each by its own task on its own
    /// connection; the answers in the same order.
    pub async fn post_all_at_once(
        &self,
        requests: &[(&str, String)],
        body: &Value,
    ) -> Vec<(StatusCode, Value)> {
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(requests.len()));
        let sent: Vec<_> = requests
            .iter()
            .map(|(admin, path)| {
                let request = self
                    .client
                    .post(format!("{}{path}", self.base))
                    .bearer_auth(admin_token_of(self.provider.as_deref(), admin))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(body.to_string());
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    let response = request.send().await.expect("an answer");
                    let status =
                        StatusCode::from_u16(response.status().as_u16()).expect("a status");
                    (
                        status,
                        response.json::<Value>().await.expect("a JSON answer"),
                    )
                })
            })
            .collect();
        let mut answers = Vec::with_capacity(sent.len());
        for answer in sent {
            answers.push(answer.await.expect("the request task"));
        }
        answers
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// An ADMIN token of `subject`, valid for an hour: signed by `provider` (a person in the ADMIN
/// group), or a break-glass one without a provider.
fn admin_token_of(provider: Option<&OidcProvider>, subject: &str) -> String {
    match provider {
        Some(provider) => {
            let mut claims = provider.claims_for(subject);
            claims["groups"] = serde_json::json!([oidc::ADMINS_GROUP]);
            provider.sign(claims)
        }
        None => auth::issue(
            ADMIN_JWT_SECRET,
            subject,
            &[Role::Admin],
            std::time::Duration::from_secs(3600),
        )
        .expect("mint a test token"),
    }
}
