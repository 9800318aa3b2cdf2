//! The [`Session`] every console page and action extracts, the login page, the break-glass
//! token form and signing out.
//!
//! The browser holds only a random secret, in the cookie [`SESSION_COOKIE`] (HttpOnly, so no
//! script reads it; `SameSite=Lax`, because the provider's redirect back to the console is a
//! cross-site top-level GET that must carry the sign-in's cookie; `Secure` when the console's
//! URL is https; `Path=/console`). What it stands for is a row of `console_sessions`
//! (`crate::console_sessions`): who signed in, with which roles, until when. No token the
//! provider issued ever reaches the browser.
//!
//! Lax lets a cookie ride along on top-level GETs from other sites, which change nothing here;
//! every POST also has to come from one of our own pages ([`same_origin`]).

use axum::{
    extract::{FromRequestParts, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts},
    response::{IntoResponse, Redirect, Response},
};
use maud::html;
use paybus_ops::actor::AuthMethod;
use uuid::Uuid;

use super::{FormFields, layout};
use crate::{
    ApiError, AppState,
    auth::{self, Caller},
    console_sessions,
    role::Role,
};

/// The cookie that holds the session's secret.
pub(crate) const SESSION_COOKIE: &str = "paybus_console";
/// Where a stranger, or a cookie whose session is over, is sent.
pub(crate) const LOGIN: &str = "/console/login";
/// Where a cookie whose session is over is sent: the login page, saying so.
const SESSION_OVER: &str = "/console/login?session=over";

/// A request from a browser with an active session whose roles allow it: reads need OPS,
/// actions ADMIN.
pub(crate) struct Session {
    /// The session's id (what ADMINs list and end it by).
    pub(crate) id: Uuid,
    pub(crate) caller: Caller,
}

impl FromRequestParts<AppState> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        if parts.method != Method::GET && !same_origin(&parts.headers) {
            return Err(layout::error_page(
                StatusCode::FORBIDDEN,
                "This form was sent from another site: refused.",
            ));
        }
        let Some(secret) = cookie(&parts.headers, SESSION_COOKIE) else {
            return Err(Redirect::to(LOGIN).into_response());
        };
        let active = async {
            let mut conn = state.pool.acquire().await?;
            console_sessions::active(&mut conn, &secret, state.console.config.idle_timeout).await
        };
        let session = match active.await {
            Ok(Some(session)) => session,
            Ok(None) => return Err(session_over(state)),
            Err(error) => return Err(layout::failure_page(error)),
        };
        if session.caller.actor.via == AuthMethod::BreakGlass {
            // Switching break-glass off closes the sessions it opened too.
            if !state.break_glass {
                return Err(session_over(state));
            }
            paybus_bus::metrics::record_break_glass();
        }
        let needed = if matches!(parts.method, Method::GET | Method::HEAD) {
            Role::Ops
        } else {
            Role::Admin
        };
        if !session.caller.allows(needed) {
            return Err(layout::error_page(
                StatusCode::FORBIDDEN,
                &format!(
                    "{}: your account does not allow it.",
                    ApiError::Forbidden(needed)
                ),
            ));
        }
        Ok(Session {
            id: session.public_id,
            caller: session.caller,
        })
    }
}

/// The login page, saying the session is over, and the stale cookie cleared.
fn session_over(state: &AppState) -> Response {
    let mut response = Redirect::to(SESSION_OVER).into_response();
    set_cookie(&mut response, state, SESSION_COOKIE, "", 0);
    response
}

/// A POST must come from a page of ours: the browser says where a form came from in
/// `Origin` (modern browsers always send it on POST); without one, the request did not come
/// from a browser form and the cookie's SameSite already did its part.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(a), Some(b)) if a.eq_ignore_ascii_case(b))
}

/// The value of cookie `name`, when the browser sent a non-empty one.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, _)| *found == name)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

/// Adds cookie `name` to `response` for the console's pages, kept `max_age` seconds (0
/// removes it). The values are base64url: nothing to escape.
pub(crate) fn set_cookie(
    response: &mut Response,
    state: &AppState,
    name: &str,
    value: &str,
    max_age: u64,
) {
    let secure = if state.console.config.secure() {
        "; Secure"
    } else {
        ""
    };
    let cookie =
        format!("{name}={value}; Path=/console; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

/// Makes a session for `caller` lasting `lasts` and answers with its cookie, on to the
/// console.
pub(crate) async fn open(
    state: &AppState,
    caller: &Caller,
    lasts: std::time::Duration,
) -> Result<Response, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let issued = console_sessions::create(&mut conn, &caller.actor, &caller.roles, lasts).await?;
    tracing::info!(
        actor = %caller.actor.name,
        issuer = %caller.actor.issuer,
        subject = %caller.actor.subject,
        session = %issued.public_id,
        "console sign-in"
    );
    let mut response = Redirect::to(super::ROOT).into_response();
    set_cookie(
        &mut response,
        state,
        SESSION_COOKIE,
        &issued.secret,
        lasts.as_secs(),
    );
    Ok(response)
}

/// `GET /console/login`: sign in with the provider; the break-glass token form only while
/// break-glass is on.
pub(crate) async fn login_page(
    State(state): State<AppState>,
    query: axum::extract::RawQuery,
) -> Response {
    let over = query
        .0
        .is_some_and(|query| query.split('&').any(|pair| pair == "session=over"));
    let notice = over.then_some(
        "Your session is over (signed out, expired, idle too long, or ended by an ADMIN): \
         sign in again.",
    );
    login_form(&state, notice, None).into_response()
}

fn break_glass_on(state: &AppState) -> bool {
    state.break_glass && state.admin_jwt_secret.is_some()
}

fn login_form(state: &AppState, notice: Option<&str>, refused: Option<&str>) -> maud::Markup {
    let provider = state
        .oidc
        .as_ref()
        .filter(|_| state.console.config.client_secret.is_some())
        .map(|verifier| {
            let issuer = &verifier.config().issuer;
            url::Url::parse(issuer)
                .ok()
                .and_then(|url| url.host_str().map(str::to_owned))
                .unwrap_or_else(|| issuer.clone())
        });
    layout::page(
        "Sign in",
        None,
        html! {
            @if let Some(notice) = notice {
                p.flash.warn role="status" { (notice) }
            }
            @if let Some(provider) = &provider {
                form #sign-in method="get" action="/console/sign-in" {
                    button type="submit" { "Sign in with " (provider) }
                }
                p.hint { "You sign in on the identity provider's own page; paybus keeps a session for this browser (an HttpOnly cookie), never your tokens." }
            } @else {
                p.flash.warn role="status" {
                    "No identity provider sign-in is configured here (PAYBUS_OIDC_ISSUER and PAYBUS_OIDC_CONSOLE_CLIENT_SECRET)."
                }
            }
            @if break_glass_on(state) {
                section #break-glass {
                    h2 { "Break-glass" }
                    p.flash.warn {
                        "Break-glass is on (PAYBUS_BREAK_GLASS): a token signed with the shared secret opens a session under any name it gives. Everything done with it is marked break-glass, and it can neither request nor approve a four-eyes action."
                    }
                    @if let Some(refused) = refused {
                        p.flash.error role="alert" { "Your token was refused: " (refused) "." }
                    }
                    form method="post" action="/console/login" {
                        label for="token" { "Break-glass token (" code { "paybus token issue --role OPS" } " or ADMIN)" }
                        textarea #token name="token" rows="4" cols="70" required {}
                        button type="submit" { "Open a break-glass session" }
                    }
                }
            }
        },
    )
}

/// `POST /console/login`: a break-glass token opens a session, while break-glass is on. The
/// token is checked as a read would be (OPS at least) and is not kept: the session lasts until
/// the token would have expired, at most the session lifetime.
pub(crate) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: FormFields,
) -> Response {
    if !same_origin(&headers) {
        return layout::error_page(
            StatusCode::FORBIDDEN,
            "This form was sent from another site.",
        );
    }
    if !break_glass_on(&state) {
        return layout::error_page(
            StatusCode::FORBIDDEN,
            "Break-glass is off (PAYBUS_BREAK_GLASS): sign in with the identity provider.",
        );
    }
    let token = form.get("token").unwrap_or_default().trim().to_owned();
    let refused = |reason: &str| {
        (
            StatusCode::UNAUTHORIZED,
            login_form(&state, None, Some(reason)),
        )
            .into_response()
    };
    let caller = match auth::authorize(&state, Some(&token), &Method::GET, "/console/login").await {
        Ok(caller) => caller,
        Err(ApiError::BadToken(reason)) => return refused(reason),
        Err(error) => return layout::failure_page(error),
    };
    if caller.actor.via != AuthMethod::BreakGlass {
        return refused(
            "only break-glass tokens are taken here; people sign in with the identity provider",
        );
    }
    let now = u64::try_from(chrono::Utc::now().timestamp()).unwrap_or(0);
    let lasts = std::time::Duration::from_secs(caller.expires_at.saturating_sub(now))
        .min(state.console.config.session_lifetime);
    open(&state, &caller, lasts)
        .await
        .unwrap_or_else(layout::failure_page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; paybus_console=abc-def_ghi; b=2"),
        );
        assert_eq!(
            cookie(&headers, SESSION_COOKIE).as_deref(),
            Some("abc-def_ghi")
        );
        headers.insert(header::COOKIE, HeaderValue::from_static("paybus_console="));
        assert_eq!(cookie(&headers, SESSION_COOKIE), None);
    }

    #[test]
    fn a_post_from_another_site_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&headers));
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&headers));
    }
}
