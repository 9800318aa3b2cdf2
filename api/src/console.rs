//! The web console (`/console`): server-rendered HTML for ops, readable without JavaScript,
//! with nothing loaded from the network (the stylesheet is inline, the pages are compiled in).
//! Its pages and their actions: docs/api.md, "The web console".
//!
//! **Who is signed in**: a person signed in at the identity provider (`sign_in`) with a
//! server-side session (`session`: a random secret in an HttpOnly cookie scoped to
//! `/console`); no token reaches the browser. Reads need OPS, actions ADMIN.
//!
//! **Every action is an admin API call**: the console sends it through the same router as the
//! session's caller, so it passes the same checks and logs as `curl` would; a route this
//! build lacks is shown as "not available on this server". An `Origin` check on every POST
//! keeps other sites from submitting forms.

mod actions;
mod approvals;
mod audit;
mod charts;
mod dead_letters;
mod jobs;
mod layout;
mod operations;
mod overview;
mod partners;
mod search;
mod session;
mod sessions;
mod sign_in;
mod suspensions;
mod trace;

use axum::{
    Router,
    body::Bytes,
    extract::{FromRequest, Request},
    http::StatusCode,
    response::{Redirect, Response},
    routing::{get, post},
};

use crate::{AppState, config::ConsoleConfig};

pub(crate) use session::Session;

/// How the console signs people in, and the client it calls the provider's token endpoint
/// with; built once at start-up.
#[derive(Clone)]
pub struct Console {
    pub config: ConsoleConfig,
    http: reqwest::Client,
}

impl Console {
    /// Every call to the provider's token endpoint gives up after this.
    const PROVIDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

    pub fn new(config: ConsoleConfig) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Self::PROVIDER_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self { config, http }
    }
}

/// Where the console lives.
pub const ROOT: &str = "/console";

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::to("/console/overview") }),
        )
        .route(
            "/console/login",
            get(session::login_page).post(session::login),
        )
        .route("/console/sign-in", get(sign_in::start))
        .route("/console/callback", get(sign_in::callback))
        .route("/console/logout", post(sign_in::logout))
        .route("/console/sessions", get(sessions::page))
        .route("/console/sessions/{id}/end", post(sessions::end))
        .route("/console/overview", get(overview::page))
        .route("/console/search", get(search::page))
        .route("/console/functions/{name}/pause", post(overview::pause))
        .route("/console/functions/{name}/resume", post(overview::resume))
        .route("/console/dead-letters", get(dead_letters::groups))
        .route("/console/dead-letters/group", get(dead_letters::group))
        .route("/console/dead-letters/replay", post(dead_letters::replay))
        .route("/console/dead-letters/archive", post(dead_letters::archive))
        .route(
            "/console/dead-letters/letter/{id}",
            get(dead_letters::letter_page),
        )
        .route("/console/operations/{id}", get(operations::page))
        .route(
            "/console/operations/{id}/approve",
            post(operations::approve),
        )
        .route(
            "/console/operations/{id}/execute",
            post(operations::execute),
        )
        .route("/console/trace", get(trace::page))
        .route("/console/approvals", get(approvals::page))
        .route("/console/approvals/{id}/approve", post(approvals::approve))
        .route("/console/approvals/{id}/execute", post(approvals::execute))
        .route("/console/jobs", get(jobs::page))
        .route("/console/jobs/{id}/retry", post(jobs::retry))
        .route("/console/suspensions", get(suspensions::page))
        .route(
            "/console/suspensions/{symbol}/retry-failed",
            post(suspensions::retry_failed),
        )
        .route("/console/audit", get(audit::page))
        .route("/console/partners", get(partners::list))
        .route("/console/partners/{id}", get(partners::page))
        .route(
            "/console/partners/{id}/notifications/{notification_id}/redeliver",
            post(partners::redeliver),
        )
        .route(
            "/console/partners/{id}/api-keys",
            post(partners::create_key),
        )
        .route(
            "/console/partners/{id}/api-keys/{key_id}/revoke",
            post(partners::revoke_key),
        )
        .route(
            "/console/partners/{id}/api-keys/{key_id}/rotate",
            post(partners::rotate_key),
        )
}

/// A submitted form (`application/x-www-form-urlencoded`), names in order and repeatable
/// (ticked checkboxes repeat `ids=`).
pub(crate) struct FormFields(Vec<(String, String)>);

impl FormFields {
    pub(crate) fn get<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        self.all(name).next()
    }

    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }
}

impl<S: Send + Sync> FromRequest<S> for FormFields {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = Bytes::from_request(request, state).await.map_err(|_| {
            layout::error_page(StatusCode::BAD_REQUEST, "The form could not be read.")
        })?;
        Ok(FormFields(
            form_urlencoded::parse(&body).into_owned().collect(),
        ))
    }
}

/// `text` for a URL's query: unreserved characters kept, every other byte `%XX`.
pub(crate) fn percent_encoded(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}
