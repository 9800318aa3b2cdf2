//! The console's frame: head, stylesheet (inline: no asset requests, nothing from the network),
//! navigation, flash messages, error pages.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::Session;
use crate::auth::Role;

const STYLE: &str = "
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d232a;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.2rem;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header a.here{color:#fff;font-weight:600}
header .who{margin-left:auto;color:#aab}header form{display:inline}
main{padding:1rem 1.2rem;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #e3e6ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.flash{padding:.6rem .8rem;border-radius:4px;background:#e8f4ea;border:1px solid #9bc9a4}
.flash.error{background:#fdecea;border-color:#e3a39b}.flash.warn{background:#fff6e0;border-color:#e6c46d}
.hint{color:#5b6570}pre{background:#fff;border:1px solid #e3e6ea;padding:.6rem;overflow:auto}
button{cursor:pointer;padding:.25rem .7rem}button.danger{color:#a40000}
progress{width:14rem}.badge{padding:0 .4rem;border-radius:3px;background:#e3e6ea}
.badge.FAILED,.badge.needs_attention,.badge.dirty,.badge.needs_human,.badge.NOT_SENT{background:#fdecea}
.badge.clean,.badge.complete,.badge.safe,.badge.REPLAYED{background:#e8f4ea}.badge.already_applied,.badge.SKIPPED{background:#eef1f4}
section{margin:1rem 0}h2{font-size:1.1rem}
textarea{display:block;margin:.4rem 0;width:100%;max-width:40rem}
";

const PAGES: [(&str, &str); 8] = [
    ("/console/overview", "Overview"),
    ("/console/dead-letters", "Dead letters"),
    ("/console/jobs", "Bonus jobs"),
    ("/console/suspensions", "Suspensions"),
    ("/console/audit", "Audit"),
    ("/console/approvals", "Approvals"),
    ("/console/partners", "Partners"),
    ("/console/trace", "Trace"),
];

/// ADMINs' own page: who is signed in to the console.
pub(crate) const SESSIONS: (&str, &str) = ("/console/sessions", "Sessions");

/// A whole page. `session` is None on the login page.
pub(crate) fn page(title: &str, session: Option<&Session>, body: Markup) -> Markup {
    page_with_head(title, session, html! {}, body)
}

/// A page with extra `<head>` content (e.g. the suspensions' self-refresh).
pub(crate) fn page_with_head(
    title: &str,
    session: Option<&Session>,
    head: Markup,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · paybus console" }
                style { (PreEscaped(STYLE)) }
                (head)
            }
            body {
                header {
                    strong { "paybus" }
                    @if let Some(session) = session {
                        @for (href, name) in PAGES {
                            a href=(href) class=[(name == title).then_some("here")] { (name) }
                        }
                        @if session.caller.allows(Role::Admin) {
                            a href=(SESSIONS.0) class=[(SESSIONS.1 == title).then_some("here")] { (SESSIONS.1) }
                        }
                        form.search method="get" action="/console/search" role="search" {
                            input type="search" name="q" placeholder="id, tx hash, reference" aria-label="Search by id, tx hash, member, charge or order reference";
                        }
                        span.who {
                            (session.caller.actor.name) " ("
                            @for (i, role) in session.caller.roles.iter().enumerate() {
                                @if i > 0 { ", " } (role)
                            }
                            ") "
                            form method="post" action="/console/logout" { button type="submit" { "Sign out" } }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// A message after an action.
pub(crate) enum Flash {
    Done(String),
    Warn(String),
    Error(String),
}

impl maud::Render for Flash {
    fn render(&self) -> Markup {
        let (class, text) = match self {
            Flash::Done(text) => ("flash", text),
            Flash::Warn(text) => ("flash warn", text),
            Flash::Error(text) => ("flash error", text),
        };
        html! { p class=(class) role="status" { (text) } }
    }
}

/// A page that could not be read: the API's error rule (a client's mistake says what it is;
/// our fault says "internal error" and logs the cause).
pub(crate) fn failure_page(error: crate::ApiError) -> Response {
    let status = error.status();
    let message = if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
        tracing::error!(error = %error.cause_chain(), "console page failed");
        "internal error".to_owned()
    } else {
        error.to_string()
    };
    error_page(status, &message)
}

pub(crate) fn error_page(status: StatusCode, message: &str) -> Response {
    let body = page(
        status.canonical_reason().unwrap_or("Error"),
        None,
        html! {
            p.flash.error role="alert" { (message) }
            p { a href="/console/login" { "Sign in again" } }
        },
    );
    (status, body).into_response()
}
