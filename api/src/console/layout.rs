//! The console's frame: head, stylesheet (inline: no asset requests, nothing from the network),
//! navigation, flash messages, error pages.
//!
//! Every page is usable by keyboard and on a phone (checked by axe-core and by the keyboard and
//! 390 px checks of `cli/tests/console_pages_browser.rs`): a skip link is the first stop of
//! the Tab key, every focused element shows a 3 px outline, the header wraps on a narrow
//! screen, and a table wider than the screen scrolls inside its own box ([`wide_table`])
//! instead of the page.

use axum::{
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::{auth::Caller, role::Role};

// Colours: text on the page's background and the header's links on its dark background all
// have a contrast of at least 4.5:1 (WCAG AA), the focus outline at least 3:1 against both.
// `.wide` is `position:relative` so that a header cell's visually hidden text (absolutely
// positioned) stays inside the scrolling box; else it widens the page at 390 px.
const STYLE: &str = "
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9;overflow-wrap:break-word}
.skip{position:absolute;left:.5rem;top:-4rem;padding:.4rem .8rem;background:#fff;color:#1d232a;z-index:1}
.skip:focus{top:.5rem}
header{background:#1d232a;color:#fff;padding:.6rem 1.2rem;display:flex;flex-wrap:wrap;gap:.5rem 1.2rem;align-items:center}
header nav{display:flex;flex-wrap:wrap;gap:.3rem 1rem}
header a{color:#cfe3ff;text-decoration:none}header a[aria-current=page]{color:#fff;font-weight:600;text-decoration:underline}
header .who{margin-left:auto;color:#aab}header form{display:inline}header input[type=search]{width:16rem;max-width:100%}
:focus-visible{outline:3px solid #1f6feb;outline-offset:2px}header :focus-visible{outline-color:#9ecbff}main:focus{outline:none}
main{padding:1rem 1.2rem;max-width:1200px}
.wide{overflow-x:auto;margin:.5rem 0;position:relative}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #e3e6ea;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.flash{padding:.6rem .8rem;border-radius:4px;background:#e8f4ea;border:1px solid #9bc9a4}
.flash.error{background:#fdecea;border-color:#e3a39b}.flash.warn{background:#fff6e0;border-color:#e6c46d}
.hint{color:#5b6570}pre{background:#fff;border:1px solid #e3e6ea;padding:.6rem;white-space:pre-wrap}
button{cursor:pointer;padding:.25rem .7rem}button.danger{color:#a40000}
progress{width:14rem;max-width:100%}.badge{padding:0 .4rem;border-radius:3px;background:#e3e6ea}
.badge.FAILED,.badge.needs_attention,.badge.dirty,.badge.needs_human,.badge.NOT_SENT{background:#fdecea}
.badge.clean,.badge.complete,.badge.safe,.badge.REPLAYED{background:#e8f4ea}.badge.already_applied,.badge.SKIPPED{background:#eef1f4}
section{margin:1rem 0}h2{font-size:1.1rem}figure{margin:1rem 0}
textarea{display:block;margin:.4rem 0;width:100%;max-width:40rem;box-sizing:border-box}
.visually-hidden{position:absolute;width:1px;height:1px;margin:-1px;padding:0;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap;border:0}
@media (max-width:600px){header{padding:.6rem .8rem}header .who{margin-left:0}main{padding:.8rem}}
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

/// A whole page for the signed-in `caller`; None on the login page.
pub(crate) fn page(title: &str, caller: Option<&Caller>, body: Markup) -> Markup {
    page_with_head(title, caller, html! {}, body)
}

/// A page with extra `<head>` content (e.g. the suspensions' self-refresh).
pub(crate) fn page_with_head(
    title: &str,
    caller: Option<&Caller>,
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
                a.skip href="#main" { "Skip to content" }
                header {
                    strong { "paybus" }
                    @if let Some(caller) = caller {
                        nav aria-label="Console pages" {
                            @for (href, name) in PAGES {
                                a href=(href) aria-current=[(name == title).then_some("page")] { (name) }
                            }
                            @if caller.allows(Role::Admin) {
                                a href=(SESSIONS.0) aria-current=[(SESSIONS.1 == title).then_some("page")] { (SESSIONS.1) }
                            }
                        }
                        form.search method="get" action="/console/search" role="search" {
                            input type="search" name="q" placeholder="id, tx hash, reference" aria-label="Search by id, tx hash, member, charge or order reference";
                        }
                        span.who {
                            (caller.actor.name) " ("
                            @for (i, role) in caller.roles.iter().enumerate() {
                                @if i > 0 { ", " } (role)
                            }
                            ") "
                            form method="post" action="/console/logout" { button type="submit" { "Sign out" } }
                        }
                    }
                }
                // Focusable by script only, so that the skip link moves the keyboard here.
                main #main tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// `table` in a box of its own that scrolls sideways when the screen is narrower than the
/// table, so that the page never does. The box is a region named `name` in the tab order: a
/// keyboard can scroll it as a mouse can (axe's `scrollable-region-focusable`).
pub(crate) fn wide_table(name: &str, table: Markup) -> Markup {
    html! { div.wide role="region" aria-label=(name) tabindex="0" { (table) } }
}

/// What a column of buttons or tick boxes is, for screen readers only (a header cell with no
/// text names nothing).
pub(crate) fn unseen(text: &str) -> Markup {
    html! { span.visually-hidden { (text) } }
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
