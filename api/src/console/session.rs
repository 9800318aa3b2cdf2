//! Logging in and out, and the [`Session`] every console page and action extracts: the token
//! from the cookie, checked by the admin API's own rule for this request's method.

use axum::{
    extract::{FromRequestParts, Query, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts},
    response::{IntoResponse, Redirect, Response},
};
use maud::html;
use serde::Deserialize;

use super::{FormFields, layout};
use crate::{
    ApiError, AppState,
    auth::{self, Caller},
};

/// The cookie that holds the token.
const COOKIE: &str = "paybus_console";

/// A request whose token allows it: reads need OPS, actions ADMIN.
pub(crate) struct Session {
    pub(crate) token: String,
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
        let token = cookie(&parts.headers);
        match auth::authorize(state, token.as_deref(), &parts.method, parts.uri.path()).await {
            Ok(caller) => Ok(Session {
                token: token.unwrap_or_default(),
                caller,
            }),
            Err(ApiError::BadToken(reason)) => {
                let to = if token.is_some() {
                    format!("/console/login?refused={}", super::percent_encoded(reason))
                } else {
                    "/console/login".to_owned()
                };
                Err(Redirect::to(&to).into_response())
            }
            Err(error @ ApiError::Forbidden(_)) => Err(layout::error_page(
                StatusCode::FORBIDDEN,
                &format!("{error}: your token does not allow it."),
            )),
            Err(error) => Err(layout::error_page(error.status(), &error.to_string())),
        }
    }
}

/// A POST must come from a page of ours: the browser says where a form came from in
/// `Origin` (modern browsers always send it on POST); without one, the request did not come
/// from a browser form and the cookie's SameSite already did its part.
fn same_origin(headers: &HeaderMap) -> bool {
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

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginQuery {
    #[serde(default)]
    refused: Option<String>,
}

pub(crate) async fn login_page(
    query: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let refused = query.ok().and_then(|Query(q)| q.refused);
    let status = if refused.is_some() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    (status, login_form(refused.as_deref())).into_response()
}

fn login_form(problem: Option<&str>) -> maud::Markup {
    layout::page(
        "Log in",
        None,
        html! {
            @if let Some(problem) = problem {
                p.flash.error role="alert" { "Your token was refused: " (problem) "." }
            }
            form method="post" action="/console/login" {
                label for="token" { "Admin token (" code { "paybus token issue --role OPS" } " or ADMIN)" }
                textarea #token name="token" rows="4" cols="70" required autofocus {}
                button type="submit" { "Log in" }
            }
            p.hint { "The token is kept in an HttpOnly cookie for this console only, until it expires or you log out." }
        },
    )
}

/// Checks the token as a read would (OPS at least), then keeps it in the cookie until it
/// expires.
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
    let token = form.get("token").unwrap_or_default().trim().to_owned();
    match auth::authorize(&state, Some(&token), &Method::GET, "/console/login").await {
        Ok(caller) => {
            let now = chrono::Utc::now().timestamp().max(0) as u64;
            let max_age = caller.expires_at.saturating_sub(now);
            tracing::info!(actor = %caller.actor.name, "console login");
            let mut response = Redirect::to("/console").into_response();
            set_cookie(&mut response, &token, max_age);
            response
        }
        Err(ApiError::BadToken(reason)) => {
            (StatusCode::UNAUTHORIZED, login_form(Some(reason))).into_response()
        }
        Err(error) => layout::error_page(error.status(), &error.to_string()),
    }
}

pub(crate) async fn logout() -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    set_cookie(&mut response, "", 0);
    response
}

fn set_cookie(response: &mut Response, token: &str, max_age: u64) {
    // A JWT is base64url and dots: nothing to escape in a cookie value.
    let cookie =
        format!("{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; paybus_console=abc.def.ghi; b=2"),
        );
        assert_eq!(cookie(&headers).as_deref(), Some("abc.def.ghi"));
        headers.insert(header::COOKIE, HeaderValue::from_static("paybus_console="));
        assert_eq!(cookie(&headers), None);
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
