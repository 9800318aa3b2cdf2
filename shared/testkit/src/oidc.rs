//! A real OpenID Connect provider for tests: panva's `oidc-provider` (OpenID Certified) on the
//! machine's Node, run by `infra/oidc/provider.mjs` with the users, clients, audience and
//! signing keys of an [`OidcSetup`], on a free loopback port; killed on drop.
//!
//! The keys are generated here, so a test can also make the tokens the provider never would
//! (expired, another audience or issuer, a key rotated out, HS256 keyed with the public key,
//! unsigned). People sign in on the provider's own pages, read and submitted as a browser would:
//! [`OidcProvider::approve_device_code`] (device flow), [`OidcProvider::authorize_code`].
//!
//! ```ignore
//! let Some(oidc) = OidcProvider::start(OidcSetup::default()).await else { return }; // skipped
//! let tokens = oidc.device_login("alice").await;
//! ```
//! Without Node or the package (`infra/oidc/install.sh`), [`OidcProvider::start`] returns `None`
//! after saying why, or fails the test when `PAYBUS_REQUIRE_OIDC_TESTS` is set.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aws_lc_rs::{
    encoding::{AsDer, Pkcs8V1Der, PublicKeyX509Der},
    rsa::{KeyPair, KeySize},
    signature::KeyPair as _,
};
use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use pkcs8::der::pem::LineEnding;
use serde::Deserialize;
use serde_json::{Value, json};

/// The API's resource indicator: the `aud` of the provider's access tokens.
pub const DEFAULT_AUDIENCE: &str = "urn:paybus:admin-api";
/// The web console: a confidential client (authorization code + PKCE, refresh tokens).
pub const CONSOLE_CLIENT_ID: &str = "paybus-console";
/// The console's client secret (a test value, like [`super::SECRETS_KEY`]).
pub const CONSOLE_CLIENT_SECRET: &str = "paybus-console-test-secret-0123456789";
/// The command line: a public client (device authorization grant, refresh tokens).
pub const CLI_CLIENT_ID: &str = "paybus-cli";
/// The group of the default setup's `alice` and `bob`.
pub const ADMINS_GROUP: &str = "paybus-admins";
/// The group of the default setup's `dave`.
pub const OPS_GROUP: &str = "paybus-ops";
/// The group of the default setup's `carol`, which names no paybus role.
pub const STAFF_GROUP: &str = "staff";
/// What the command line asks for: an ID token, a refresh token, and the claims.
pub const CLI_SCOPE: &str = "openid offline_access email profile groups";

/// How long the provider gets to print `listening`: 0.6 to 0.9 s here when idle, and the
/// machines are shared and busy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Pages of the provider a sign-in goes through: the device flow's takes five.
const MAX_PAGES: usize = 12;

/// A person the provider knows; they sign in with their login, the key of
/// [`OidcSetup::users`] (the provider's development pages ask for no password).
#[derive(Debug, Clone, PartialEq)]
pub struct OidcUser {
    pub groups: Vec<String>,
    pub email: String,
}

impl OidcUser {
    pub fn new(groups: &[&str], email: &str) -> Self {
        Self {
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            email: email.to_owned(),
        }
    }
}

/// What the provider is started with.
#[derive(Debug, Clone)]
pub struct OidcSetup {
    /// The access tokens' `aud`, an absolute URI (a resource indicator, RFC 8707).
    pub audience: String,
    /// Login → groups and email. Nobody else can sign in.
    pub users: BTreeMap<String, OidcUser>,
    /// Where the console's sign-in may return (`redirect_uris` of [`CONSOLE_CLIENT_ID`]).
    /// The console client exists only once it has one: the provider refuses a code client
    /// without any.
    pub console_redirect_uris: Vec<String>,
    /// Where the console's sign-out may land (`post_logout_redirect_uris`).
    pub console_post_logout_redirect_uris: Vec<String>,
    pub access_token_ttl: Duration,
}

impl Default for OidcSetup {
    /// `alice` and `bob` in [`ADMINS_GROUP`], `carol` in [`STAFF_GROUP`] (no paybus role),
    /// `dave` in [`OPS_GROUP`]; access tokens for [`DEFAULT_AUDIENCE`] valid 10 minutes.
    fn default() -> Self {
        let users = [
            ("alice", ADMINS_GROUP),
            ("bob", ADMINS_GROUP),
            ("carol", STAFF_GROUP),
            ("dave", OPS_GROUP),
        ]
        .into_iter()
        .map(|(login, group)| {
            (
                login.to_owned(),
                OidcUser::new(&[group], &format!("{login}@example.com")),
            )
        })
        .collect();
        Self {
            audience: DEFAULT_AUDIENCE.to_owned(),
            users,
            console_redirect_uris: Vec::new(),
            console_post_logout_redirect_uris: Vec::new(),
            access_token_ttl: Duration::from_secs(600),
        }
    }
}

impl OidcSetup {
    /// The console signs in through `redirect_uri` and lands on `post_logout_redirect_uri`
    /// after signing out.
    pub fn console_redirect(mut self, redirect_uri: &str, post_logout_redirect_uri: &str) -> Self {
        self.console_redirect_uris = vec![redirect_uri.to_owned()];
        self.console_post_logout_redirect_uris = vec![post_logout_redirect_uri.to_owned()];
        self
    }

    /// Client metadata in RFC 7591's names, as the provider reads it.
    fn clients(&self) -> Vec<Value> {
        let mut clients = vec![json!({
            "client_id": CLI_CLIENT_ID,
            "application_type": "native",
            "token_endpoint_auth_method": "none",
            "grant_types": ["urn:ietf:params:oauth:grant-type:device_code", "refresh_token"],
            "response_types": [],
        })];
        if !self.console_redirect_uris.is_empty() {
            clients.push(json!({
                "client_id": CONSOLE_CLIENT_ID,
                "client_secret": CONSOLE_CLIENT_SECRET,
                "grant_types": ["authorization_code", "refresh_token"],
                "response_types": ["code"],
                "redirect_uris": self.console_redirect_uris,
                "post_logout_redirect_uris": self.console_post_logout_redirect_uris,
            }));
        }
        clients
    }
}

/// An RSA signing key: its private JWK for the provider, its PKCS#1 form for signing here.
#[derive(Clone)]
struct SigningKey {
    kid: String,
    private_jwk: Value,
    pkcs1_der: Vec<u8>,
    public_pem: String,
}

impl SigningKey {
    /// A fresh RSA-2048 key. aws-lc-rs generates it (in C, so a debug build is no slower:
    /// 0.1 to 0.5 s here, the search for primes varies) and exports only PKCS#8; the JWK's
    /// numbers are read back from that export.
    fn generate() -> Self {
        let pair = KeyPair::generate(KeySize::Rsa2048).expect("generate an RSA key");
        let pkcs8: Pkcs8V1Der<'static> = pair.as_der().expect("export the key as PKCS#8");
        let info = pkcs8::PrivateKeyInfo::try_from(pkcs8.as_ref()).expect("read the PKCS#8");
        let rsa = pkcs1::RsaPrivateKey::try_from(info.private_key).expect("read the RSA key");
        let b64 = |n: pkcs1::UintRef<'_>| URL_SAFE_NO_PAD.encode(n.as_bytes());
        let kid = format!(
            "paybus-test-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let private_jwk = json!({
            "kty": "RSA",
            "kid": kid,
            "alg": "RS256",
            "use": "sig",
            "n": b64(rsa.modulus),
            "e": b64(rsa.public_exponent),
            "d": b64(rsa.private_exponent),
            "p": b64(rsa.prime1),
            "q": b64(rsa.prime2),
            "dp": b64(rsa.exponent1),
            "dq": b64(rsa.exponent2),
            "qi": b64(rsa.coefficient),
        });
        let spki: PublicKeyX509Der<'static> =
            pair.public_key().as_der().expect("export the public key");
        let public_pem =
            pkcs8::der::pem::encode_string("PUBLIC KEY", LineEnding::LF, spki.as_ref())
                .expect("PEM-encode the public key");
        Self {
            kid,
            private_jwk,
            pkcs1_der: info.private_key.to_vec(),
            public_pem,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let header = access_token_header(Algorithm::RS256, &self.kid);
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(&self.pkcs1_der))
            .expect("sign the token")
    }
}

/// The header the provider gives its access tokens (RFC 9068's `at+jwt`).
fn access_token_header(algorithm: Algorithm, kid: &str) -> Header {
    let mut header = Header::new(algorithm);
    header.kid = Some(kid.to_owned());
    header.typ = Some("at+jwt".to_owned());
    header
}

/// Node and `provider.mjs` with `oidc-provider` installed beside it.
#[derive(Debug, Clone)]
struct Installation {
    node: PathBuf,
    script: PathBuf,
}

impl Installation {
    /// From `PAYBUS_TEST_NODE` and `PAYBUS_TEST_OIDC_PROVIDER` (what `infra/oidc/install.sh`
    /// prints), else `node` on the `PATH` and the repository's `.local/oidc`; `Err` says what
    /// is missing. A stale installed copy of `provider.mjs` panics instead: the tools are
    /// there, only not the provider the repository describes.
    fn find() -> Result<Self, String> {
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let repository = repository.canonicalize().unwrap_or(repository);
        let node = std::env::var_os("PAYBUS_TEST_NODE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("node"));
        let runs = std::process::Command::new(&node)
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success());
        if !runs {
            return Err(format!("{} does not run", node.display()));
        }
        let installed_copy = repository.join(".local/oidc/provider.mjs");
        let script = std::env::var_os("PAYBUS_TEST_OIDC_PROVIDER")
            .map(PathBuf::from)
            .unwrap_or_else(|| installed_copy.clone());
        let package = script
            .parent()
            .map(|dir| dir.join("node_modules/oidc-provider/package.json"));
        if !script.exists() || !package.is_some_and(|p| p.exists()) {
            return Err(format!(
                "{} with oidc-provider beside it is missing",
                script.display()
            ));
        }
        // install.sh copies provider.mjs next to the packages it imports: a copy older than
        // the repository's would run a provider the test does not describe.
        let source = repository.join("infra/oidc/provider.mjs");
        if same_file(&script, &installed_copy)
            && std::fs::read(&script).ok() != std::fs::read(&source).ok()
        {
            panic!(
                "{} differs from {}: run infra/oidc/install.sh",
                script.display(),
                source.display()
            );
        }
        Ok(Self { node, script })
    }

    /// The installation, or `None` after printing why the test is skipped; a panic instead
    /// when `PAYBUS_REQUIRE_OIDC_TESTS` is set (infra/test.sh sets it, so CI never skips).
    fn required_or_skip() -> Option<Self> {
        match Self::find() {
            Ok(installation) => Some(installation),
            Err(missing) => {
                let message = format!(
                    "the test OpenID provider cannot run: {missing}; run infra/oidc/install.sh \
                     (infra/test.sh does)"
                );
                if std::env::var_os("PAYBUS_REQUIRE_OIDC_TESTS").is_some() {
                    panic!("{message}");
                }
                eprintln!("SKIPPED: {message}");
                None
            }
        }
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// The running `node provider.mjs` and everything it printed.
struct ProviderProcess {
    child: tokio::process::Child,
    output: Arc<Mutex<String>>,
}

impl ProviderProcess {
    /// Spawns the provider on `config` and returns once it prints `listening <issuer>`.
    async fn start(installation: &Installation, config: &Path, issuer: &str) -> Self {
        let mut child = tokio::process::Command::new(&installation.node)
            .arg(&installation.script)
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", installation.node.display()));
        let output = Arc::new(Mutex::new(String::new()));
        let (listening, mut ready) = tokio::sync::watch::channel(false);
        let expected = format!("listening {issuer}");
        if let Some(stdout) = child.stdout.take() {
            copy_lines(stdout, output.clone(), move |line| {
                if line == expected {
                    let _ = listening.send(true);
                }
            });
        }
        if let Some(stderr) = child.stderr.take() {
            copy_lines(stderr, output.clone(), |_| {});
        }
        let mut process = Self { child, output };
        let started = tokio::time::timeout(START_TIMEOUT, async {
            tokio::select! {
                Ok(_) = ready.wait_for(|listening| *listening) => Ok(()),
                status = process.child.wait() => Err(status),
            }
        })
        .await;
        match started {
            Ok(Ok(())) => process,
            Ok(Err(status)) => {
                // Its last words are still in the pipes the copying tasks read.
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "the OpenID provider exited ({status:?}):\n{}",
                    process.output()
                )
            }
            Err(_) => panic!(
                "the OpenID provider did not start within {START_TIMEOUT:?}:\n{}",
                process.output()
            ),
        }
    }

    fn output(&self) -> String {
        self.output
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// Appends each line of `pipe` to `output` (echoed with `TEST_LOG=1`) and shows it to `seen`.
fn copy_lines(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    output: Arc<Mutex<String>>,
    mut seen: impl FnMut(&str) + Send + 'static,
) {
    let echo = std::env::var_os("TEST_LOG").is_some();
    tokio::spawn(async move {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if echo {
                eprintln!("[oidc-provider] {line}");
            }
            seen(&line);
            let mut text = output.lock().unwrap_or_else(|p| p.into_inner());
            text.push_str(&line);
            text.push('\n');
        }
    });
}

/// A token response (RFC 6749 §5.1).
#[derive(Debug, Clone, Deserialize)]
pub struct Tokens {
    pub access_token: String,
    pub token_type: String,
    pub expires_in: u64,
    pub scope: Option<String>,
    pub id_token: Option<String>,
    pub refresh_token: Option<String>,
}

/// An error response of the token endpoint (RFC 6749 §5.2), e.g. `access_denied`.
#[derive(Debug, Clone, PartialEq, Deserialize, thiserror::Error)]
#[error("{error}: {}", error_description.as_deref().unwrap_or_default())]
pub struct TokenError {
    pub error: String,
    pub error_description: Option<String>,
}

/// A device authorization response (RFC 8628 §3.2).
#[derive(Debug, Clone, Deserialize)]
pub struct DeviceAuthorization {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    pub verification_uri_complete: String,
    pub expires_in: u64,
    pub interval: Option<u64>,
}

/// The provider's pages ended a sign-in without approving it: an error status, or a page
/// asking for the user code again (how the device flow says the sign-in was refused).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the provider refused the sign-in ({status}) at {url}: {text}")]
pub struct SignInRefused {
    pub status: u16,
    pub url: String,
    /// The page's text, whitespace collapsed.
    pub text: String,
}

/// panva's `oidc-provider` running with an [`OidcSetup`] (killed on drop).
pub struct OidcProvider {
    setup: OidcSetup,
    installation: Installation,
    port: u16,
    dir: ConfigDir,
    /// Published in the JWKS, the first one signing.
    keys: Vec<SigningKey>,
    /// Keys that signed before a rotation, the latest last.
    retired: Vec<SigningKey>,
    /// Never published: its tokens have a `kid` the JWKS does not have. Made when first
    /// used, a key costing a few tenths of a second.
    unknown: OnceLock<SigningKey>,
    process: ProviderProcess,
}

impl OidcProvider {
    /// Starts the provider with a fresh signing key on a free loopback port; `None` (after
    /// printing why) when Node or the package is missing, unless `PAYBUS_REQUIRE_OIDC_TESTS`
    /// is set (then it panics).
    pub async fn start(setup: OidcSetup) -> Option<Self> {
        let installation = Installation::required_or_skip()?;
        let port = super::free_port();
        let dir = ConfigDir::create();
        let keys = vec![SigningKey::generate()];
        let config = write_config(&dir.0, &setup, port, &keys);
        let process = ProviderProcess::start(&installation, &config, &issuer_at(port)).await;
        Some(Self {
            setup,
            installation,
            port,
            dir,
            keys,
            retired: Vec::new(),
            unknown: OnceLock::new(),
            process,
        })
    }

    /// `http://127.0.0.1:<port>`: every token's `iss`.
    pub fn issuer(&self) -> String {
        issuer_at(self.port)
    }

    pub fn audience(&self) -> &str {
        &self.setup.audience
    }

    pub fn discovery_url(&self) -> String {
        format!("{}/.well-known/openid-configuration", self.issuer())
    }

    pub fn setup(&self) -> &OidcSetup {
        &self.setup
    }

    /// The `kid` of the key that signs now.
    pub fn kid(&self) -> &str {
        &self.current_key().kid
    }

    /// The `kid` of the key that signed before the last rotation.
    pub fn retired_kid(&self) -> Option<&str> {
        self.retired.last().map(|key| key.kid.as_str())
    }

    /// Everything the provider printed (its warnings, and the reason of each error it
    /// answered, e.g. `grant.error: access_denied: no such user: mallory`).
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// The claims of an access token the provider would issue to `user` now: `iss`, `aud`,
    /// `sub`, `exp` (the setup's lifetime), `iat`, `nbf`, `jti`, `client_id`, `scope`,
    /// `groups`, `email`, `preferred_username` (none of the groups for a user the setup does
    /// not have). Change any and [`sign`](Self::sign) it.
    pub fn claims_for(&self, user: &str) -> Value {
        let now = unix_now();
        let (groups, email) = self.setup.users.get(user).map_or_else(
            || (Vec::new(), format!("{user}@example.com")),
            |u| (u.groups.clone(), u.email.clone()),
        );
        json!({
            "iss": self.issuer(),
            "aud": self.setup.audience,
            "sub": user,
            "exp": now + self.setup.access_token_ttl.as_secs(),
            "iat": now,
            "nbf": now,
            "jti": uuid::Uuid::new_v4().simple().to_string(),
            "client_id": CLI_CLIENT_ID,
            "scope": "groups",
            "groups": groups,
            "email": email,
            "preferred_username": user,
        })
    }

    /// A JWT of `claims` signed RS256 by the provider's current key, with its `kid`: what the
    /// provider's own access tokens look like, whatever the claims say.
    pub fn sign(&self, claims: Value) -> String {
        self.current_key().sign(&claims)
    }

    /// Signed by the key that signed before the last [`rotate_keys`](Self::rotate_keys):
    /// still published after `rotate_keys(true)`, not after `rotate_keys(false)`.
    pub fn sign_with_retired_key(&self, claims: Value) -> String {
        self.retired
            .last()
            .expect("sign_with_retired_key needs a rotate_keys first")
            .sign(&claims)
    }

    /// Signed by an RSA key the provider never published, under a `kid` of its own.
    pub fn sign_with_unknown_key(&self, claims: Value) -> String {
        self.unknown.get_or_init(SigningKey::generate).sign(&claims)
    }

    /// Algorithm confusion: HS256 keyed with the current key's public key (its PEM, as a
    /// verifier that takes the key's bytes for any algorithm would use it), with its `kid`.
    pub fn sign_hs256_with_public_key(&self, claims: Value) -> String {
        let key = self.current_key();
        let header = access_token_header(Algorithm::HS256, &key.kid);
        jsonwebtoken::encode(
            &header,
            &claims,
            &EncodingKey::from_secret(key.public_pem.as_bytes()),
        )
        .expect("sign the token")
    }

    /// `alg: none`: the claims with the current `kid` and no signature.
    pub fn unsigned(&self, claims: Value) -> String {
        let header = json!({"alg": "none", "typ": "at+jwt", "kid": self.kid()});
        format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    }

    /// The current key's public key, PEM (SPKI).
    pub fn public_key_pem(&self) -> &str {
        &self.current_key().public_pem
    }

    /// Restarts the provider on the same port with a new signing key, first in the JWKS;
    /// `keep_old` keeps the keys published until now after it (tokens they signed still
    /// verify), else they are gone from the JWKS. The provider's sessions and refresh tokens
    /// are in memory and do not survive it.
    pub async fn rotate_keys(&mut self, keep_old: bool) {
        let old = std::mem::replace(&mut self.keys, vec![SigningKey::generate()]);
        self.retired.push(old[0].clone());
        if keep_old {
            self.keys.extend(old);
        }
        self.restart().await;
    }

    /// Restarts the provider on the same port and keys with the setup `change` makes (a
    /// console redirect URI known only once the API listens, a user's groups changed).
    pub async fn reconfigure(&mut self, change: impl FnOnce(&mut OidcSetup)) {
        change(&mut self.setup);
        self.restart().await;
    }

    async fn restart(&mut self) {
        self.process.stop().await;
        let config = write_config(&self.dir.0, &self.setup, self.port, &self.keys);
        self.process = ProviderProcess::start(&self.installation, &config, &self.issuer()).await;
    }

    fn current_key(&self) -> &SigningKey {
        &self.keys[0]
    }

    /// The discovery document.
    pub async fn discovery(&self) -> Value {
        get_json(&self.discovery_url()).await
    }

    /// The JWKS the provider publishes (its `jwks_uri`).
    pub async fn jwks(&self) -> Value {
        let discovery = self.discovery().await;
        let uri = discovery["jwks_uri"]
            .as_str()
            .expect("the discovery document has a jwks_uri");
        get_json(uri).await
    }

    /// A device authorization as the command line starts it ([`CLI_CLIENT_ID`],
    /// [`CLI_SCOPE`]).
    pub async fn start_device_authorization(&self) -> DeviceAuthorization {
        let endpoint = self.endpoint("device_authorization_endpoint").await;
        let response = http_client()
            .post(endpoint)
            .form(&[("client_id", CLI_CLIENT_ID), ("scope", CLI_SCOPE)])
            .send()
            .await
            .expect("reach the device authorization endpoint");
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "device authorization: {status} {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("device authorization {body}: {e}"))
    }

    /// The command line's polling (RFC 8628 §3.4): the tokens once the code is approved, the
    /// provider's error once it is refused or expired.
    pub async fn device_token(
        &self,
        authorization: &DeviceAuthorization,
    ) -> Result<Tokens, TokenError> {
        let endpoint = self.endpoint("token_endpoint").await;
        let interval = Duration::from_secs(authorization.interval.unwrap_or(5));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(authorization.expires_in);
        loop {
            let response = http_client()
                .post(&endpoint)
                .form(&[
                    ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                    ("device_code", authorization.device_code.as_str()),
                    ("client_id", CLI_CLIENT_ID),
                ])
                .send()
                .await
                .expect("reach the token endpoint");
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            if status.is_success() {
                return Ok(serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("token response {body}: {e}")));
            }
            let error: TokenError = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("token error {status} {body}: {e}"));
            let pending = matches!(error.error.as_str(), "authorization_pending" | "slow_down");
            if !pending || tokio::time::Instant::now() + interval > deadline {
                return Err(error);
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// `user` signs in with the command line's device flow: a code requested, approved on the
    /// provider's pages, exchanged for tokens.
    pub async fn device_login(&self, user: &str) -> Tokens {
        let authorization = self.start_device_authorization().await;
        if let Err(refused) = self
            .approve_device_code(&authorization.verification_uri_complete, user)
            .await
        {
            panic!("{user} could not approve the device code: {refused}");
        }
        self.device_token(&authorization)
            .await
            .unwrap_or_else(|e| panic!("{user}'s device login: {e}\n{}", self.output()))
    }

    /// What a person does with the link the command line shows: opens it, confirms the code,
    /// signs in as `user` and consents, on the provider's own pages. Each page's form is read
    /// and submitted as a browser would (hidden fields as they are, the login field filled,
    /// cookies kept), so nothing here knows the provider's paths beyond the link itself.
    pub async fn approve_device_code(
        &self,
        verification_uri_complete: &str,
        user: &str,
    ) -> Result<(), SignInRefused> {
        let browser = reqwest::Client::builder()
            .cookie_store(true)
            .timeout(Duration::from_secs(10))
            .build()
            .expect("build the browser's HTTP client");
        let mut response = browser
            .get(verification_uri_complete)
            .send()
            .await
            .expect("open the verification link");
        for _ in 0..MAX_PAGES {
            let status = response.status();
            let url = response.url().clone();
            let html = response.text().await.expect("read the provider's page");
            let page = Page::parse(&html);
            let refused = || SignInRefused {
                status: status.as_u16(),
                url: url.to_string(),
                text: page.text.clone(),
            };
            if !status.is_success() {
                return Err(refused());
            }
            // The last page thanks the person and has nothing left to submit.
            let Some(form) = page.forms.first() else {
                return Ok(());
            };
            let Some(fields) = form.filled_in_as(user) else {
                return Err(refused());
            };
            let action = url
                .join(&form.action)
                .unwrap_or_else(|e| panic!("the form's action {:?}: {e}", form.action));
            let request = if form.method.eq_ignore_ascii_case("get") {
                browser.get(action).query(&fields)
            } else {
                browser.post(action).form(&fields)
            };
            response = request.send().await.expect("submit the provider's form");
        }
        panic!("the sign-in did not end within {MAX_PAGES} pages")
    }

    /// What a person's browser does once a client (the console's `GET /console/sign-in`)
    /// sends it to `authorization_url`: signs in as `user` and consents on the provider's own
    /// pages, submitting each page's form as [`approve_device_code`](Self::approve_device_code)
    /// does, until the provider sends it away to the client's redirect URI. That URL (with
    /// `code` and `state`, or `error`) is returned, not followed: the test delivers it to the
    /// client itself. A page that neither goes on nor sends the browser back is the refusal.
    pub async fn authorize_code(
        &self,
        authorization_url: &str,
        user: &str,
    ) -> Result<reqwest::Url, SignInRefused> {
        let provider = reqwest::Url::parse(&self.issuer()).expect("the issuer is a URL");
        let stays = provider.origin();
        let browser = reqwest::Client::builder()
            .cookie_store(true)
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.url().origin() == stays {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()
            .expect("build the browser's HTTP client");
        let mut response = browser
            .get(authorization_url)
            .send()
            .await
            .expect("open the authorization URL");
        for _ in 0..MAX_PAGES {
            let status = response.status();
            let url = response.url().clone();
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|value| value.to_str().ok())
                    .expect("a redirect has a Location");
                return Ok(url.join(location).expect("the Location is a URL"));
            }
            let html = response.text().await.expect("read the provider's page");
            let page = Page::parse(&html);
            let refused = || SignInRefused {
                status: status.as_u16(),
                url: url.to_string(),
                text: page.text.clone(),
            };
            let submission = page
                .forms
                .first()
                .filter(|_| status.is_success())
                .and_then(|form| Some((form, form.filled_in_as(user)?)));
            let Some((form, fields)) = submission else {
                return Err(refused());
            };
            let action = url
                .join(&form.action)
                .unwrap_or_else(|e| panic!("the form's action {:?}: {e}", form.action));
            let request = if form.method.eq_ignore_ascii_case("get") {
                browser.get(action).query(&fields)
            } else {
                browser.post(action).form(&fields)
            };
            response = request.send().await.expect("submit the provider's form");
        }
        panic!("the sign-in did not end within {MAX_PAGES} pages")
    }

    async fn endpoint(&self, name: &str) -> String {
        self.discovery().await[name]
            .as_str()
            .unwrap_or_else(|| panic!("the discovery document has no {name}"))
            .to_owned()
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.process.child.start_kill();
    }
}

/// The folder of the provider's configuration (its private keys included), removed on drop,
/// also when the provider fails to start.
struct ConfigDir(PathBuf);

impl ConfigDir {
    fn create() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "paybus-oidc-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&dir).expect("create the provider's folder");
        Self(dir)
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn issuer_at(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The provider's configuration file (see `infra/oidc/provider.mjs`).
fn write_config(dir: &Path, setup: &OidcSetup, port: u16, keys: &[SigningKey]) -> PathBuf {
    let users: serde_json::Map<String, Value> = setup
        .users
        .iter()
        .map(|(login, user)| {
            (
                login.clone(),
                json!({"groups": user.groups, "email": user.email}),
            )
        })
        .collect();
    let config = json!({
        "issuer": issuer_at(port),
        "port": port,
        "audience": setup.audience,
        "keys": keys.iter().map(|key| key.private_jwk.clone()).collect::<Vec<_>>(),
        "users": users,
        "clients": setup.clients(),
        "access_token_ttl_seconds": setup.access_token_ttl.as_secs(),
    });
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).expect("write the provider's configuration");
    path
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("build an HTTP client")
}

async fn get_json(url: &str) -> Value {
    let response = http_client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status();
    assert!(status.is_success(), "GET {url}: {status}");
    response
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// The claims of a JWT, unverified (to look at what a token says; verifying is the API's job).
pub fn unverified_claims(jwt: &str) -> Value {
    let payload = jwt.split('.').nth(1).expect("a JWT has a payload");
    let json = URL_SAFE_NO_PAD
        .decode(payload)
        .expect("the payload is base64url");
    serde_json::from_slice(&json).expect("the payload is JSON")
}

/// What a browser sees of one page: its forms and its text.
#[derive(Debug, Default)]
struct Page {
    forms: Vec<Form>,
    text: String,
}

#[derive(Debug, Default)]
struct Form {
    action: String,
    method: String,
    inputs: Vec<Input>,
}

#[derive(Debug)]
struct Input {
    kind: String,
    name: String,
    value: String,
    checked: bool,
}

impl Form {
    /// The fields a person signing in as `user` submits with the form's unnamed button:
    /// hidden ones as they are, ticked boxes, the login field filled with `user` (the
    /// development login page takes any password). `None` when the form asks for text that
    /// is not a login, which on the provider's pages is the user code asked for again.
    fn filled_in_as(&self, user: &str) -> Option<Vec<(String, String)>> {
        let is_login = self.inputs.iter().any(|input| input.kind == "password");
        let mut fields = Vec::new();
        for input in self.inputs.iter().filter(|input| !input.name.is_empty()) {
            let value = match input.kind.as_str() {
                "hidden" => input.value.clone(),
                "checkbox" | "radio" if input.checked => input.value.clone(),
                "checkbox" | "radio" | "submit" | "button" | "image" | "reset" => continue,
                "password" => "-".to_owned(),
                _ if is_login => user.to_owned(),
                _ => return None,
            };
            fields.push((input.name.clone(), value));
        }
        Some(fields)
    }
}

impl Page {
    fn parse(html: &str) -> Self {
        use html5gum::{DefaultEmitter, Token, Tokenizer};
        let mut emitter = DefaultEmitter::default();
        // Styles and scripts as raw text, as a browser reads them, not as markup.
        emitter.naively_switch_states(true);
        let mut page = Page::default();
        let mut open_form: Option<Form> = None;
        let mut hidden_text = 0usize;
        let mut text = String::new();
        for token in Tokenizer::new_with_emitter(html, emitter).flatten() {
            match token {
                Token::StartTag(tag) => {
                    let attribute = |name: &str| {
                        tag.attributes
                            .get(name.as_bytes())
                            .map(|value| String::from_utf8_lossy(value).into_owned())
                    };
                    match tag.name.as_slice() {
                        b"form" => {
                            open_form = Some(Form {
                                action: attribute("action").unwrap_or_default(),
                                method: attribute("method").unwrap_or_else(|| "get".to_owned()),
                                inputs: Vec::new(),
                            });
                        }
                        b"input" => {
                            if let Some(form) = open_form.as_mut() {
                                form.inputs.push(Input {
                                    kind: attribute("type")
                                        .unwrap_or_else(|| "text".to_owned())
                                        .to_ascii_lowercase(),
                                    name: attribute("name").unwrap_or_default(),
                                    value: attribute("value").unwrap_or_default(),
                                    checked: attribute("checked").is_some(),
                                });
                            }
                        }
                        b"style" | b"script" | b"head" => hidden_text += 1,
                        _ => {}
                    }
                }
                Token::EndTag(tag) => match tag.name.as_slice() {
                    b"form" => page.forms.extend(open_form.take()),
                    b"style" | b"script" | b"head" => hidden_text = hidden_text.saturating_sub(1),
                    _ => {}
                },
                Token::String(string) if hidden_text == 0 => {
                    text.push_str(&String::from_utf8_lossy(&string));
                    text.push(' ');
                }
                _ => {}
            }
        }
        page.forms.extend(open_form);
        page.text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        page
    }
}
