//! The partner pages: every partner with its webhook endpoint's state, and one partner's
//! endpoint, API keys and recent notifications with each delivery attempt. Re-delivering a
//! notification and creating, rotating or revoking a key are the admin API's calls
//! (`/v1/admin/partners/{id}/…`); a key made here is shown once, on the answer's page only.

use axum::{
    extract::{Path, State, rejection::PathRejection},
    http::{HeaderValue, Method, header},
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use paybus_config::redact;
use paybus_partners::{Partner, breaker::BreakerState, partner};
use serde_json::{Value, json};

use super::{
    FormFields, Session, actions,
    layout::{self, Flash},
};
use crate::{
    AppState,
    admin::{path_id, path_ids},
    partners::keys::{self, KeyView},
    partners::{NotificationWithAttempts, notifications_with_attempts},
};

pub(crate) const TITLE: &str = "Partners";
/// Partners listed (by id); the admin API pages through the rest.
const SHOWN: u32 = 200;
/// A partner page's most recent notifications.
const RECENT_NOTIFICATIONS: u32 = 20;
/// The rotation overlaps offered (seconds, label); the API's default first.
const OVERLAPS: [(u64, &str); 4] = [
    (24 * 3600, "24 hours"),
    (3600, "1 hour"),
    (7 * 24 * 3600, "7 days"),
    (0, "none: the old key stops at once"),
];

fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Where a webhook endpoint stands, worst first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EndpointState {
    /// The partner takes no webhooks (no URL).
    NoWebhooks,
    /// It answered 410 Gone: nothing is sent until its URL is set again.
    Disabled,
    /// Its breaker is open: deliveries are parked until the next probe.
    Open,
    /// The cool-down passed: the next delivery is the probe.
    Probing,
    /// Deliveries go out, but the last ones failed.
    Failing,
    Active,
}

impl EndpointState {
    fn of(partner: &Partner) -> Self {
        let breaker = &partner.webhook_breaker;
        if partner.webhook_url.is_none() {
            Self::NoWebhooks
        } else if partner.webhook_disabled.is_some() {
            Self::Disabled
        } else {
            match breaker.state {
                BreakerState::Open => Self::Open,
                BreakerState::HalfOpen => Self::Probing,
                BreakerState::Closed if breaker.consecutive_failures > 0 => Self::Failing,
                BreakerState::Closed => Self::Active,
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::NoWebhooks => "no_webhooks",
            Self::Disabled => "disabled",
            Self::Open => "breaker_open",
            Self::Probing => "probing",
            Self::Failing => "failing",
            Self::Active => "active",
        }
    }

    /// The state in words, with since when.
    fn describe(self, partner: &Partner) -> String {
        let breaker = &partner.webhook_breaker;
        let opened = breaker
            .opened_at
            .map(|at| format!(" since {}", time(at)))
            .unwrap_or_default();
        match self {
            Self::NoWebhooks => "no webhook URL: notifications are skipped".to_owned(),
            Self::Disabled => {
                partner
                    .webhook_disabled
                    .as_ref()
                    .map_or_else(String::new, |disabled| {
                        format!(
                            "disabled since {} ({}): nothing is sent until its URL is set again",
                            time(disabled.since),
                            disabled.reason.as_deref().unwrap_or("no reason recorded")
                        )
                    })
            }
            Self::Open => format!(
                "breaker open{opened} after {} consecutive failures: deliveries parked until {}",
                breaker.consecutive_failures,
                breaker.open_until.map(time).unwrap_or_default()
            ),
            Self::Probing => format!(
                "breaker half-open{opened}: the next delivery probes the endpoint ({} consecutive failures)",
                breaker.consecutive_failures
            ),
            Self::Failing => format!(
                "active, {} consecutive failure(s)",
                breaker.consecutive_failures
            ),
            Self::Active => "active".to_owned(),
        }
    }
}

/// `GET /console/partners`.
pub(crate) async fn list(State(state): State<AppState>, session: Session) -> Response {
    let partners = async {
        let mut conn = state.pool.acquire().await?;
        partner::list(&mut conn, 0, SHOWN).await
    };
    let partners = match partners.await {
        Ok(partners) => partners,
        Err(error) => return layout::failure_page(error.into()),
    };
    let cut_off = partners
        .iter()
        .filter(|p| {
            matches!(
                EndpointState::of(p),
                EndpointState::Disabled | EndpointState::Open | EndpointState::Probing
            )
        })
        .count();
    layout::page(
        TITLE,
        Some(&session.caller),
        html! {
            p.hint { (partners.len()) " partner(s) by id; " (cut_off) " whose webhooks are not going out (disabled by a 410, or cut off by their breaker). Times UTC." }
            @if partners.is_empty() {
                p.flash { "No partner yet." }
            } @else {
                (layout::wide_table("Partners", html! { table #partners {
                    thead { tr { th.n scope="col" { "Id" } th scope="col" { "Partner" } th scope="col" { "Webhook endpoint" } th scope="col" { "State" } } }
                    tbody {
                        @for partner in &partners {
                            @let endpoint = EndpointState::of(partner);
                            tr.partner data-id=(partner.id) data-state=(endpoint.name()) {
                                td.n { (partner.id) }
                                td { a href=(format!("/console/partners/{}", partner.id)) { (partner.name) } }
                                td { (partner.webhook_url.as_deref().map(redact::text).unwrap_or_default()) }
                                td { span class=(format!("badge {}", endpoint.name())) { (endpoint.name().replace('_', " ")) } " " (endpoint.describe(partner)) }
                            }
                        }
                    }
                } }))
            }
        },
    )
    .into_response()
}

/// `GET /console/partners/{id}`.
pub(crate) async fn page(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    match path_id(id) {
        Ok(id) => render(&state, &session, id, None).await,
        Err(error) => layout::failure_page(error),
    }
}

/// What an action leaves on the page: its message, and a key made by it (shown this once).
struct Outcome {
    flash: Flash,
    new_key: Option<String>,
}

impl From<Flash> for Outcome {
    fn from(flash: Flash) -> Self {
        Self {
            flash,
            new_key: None,
        }
    }
}

async fn render(
    state: &AppState,
    session: &Session,
    partner_id: u64,
    outcome: Option<Outcome>,
) -> Response {
    let read = async {
        let mut conn = state.pool.acquire().await?;
        let Some(partner) = partner::find(&mut conn, partner_id).await? else {
            return Ok(None);
        };
        let keys = keys::of_partner(&mut conn, partner_id).await?;
        let notifications =
            notifications_with_attempts(&mut conn, partner_id, None, RECENT_NOTIFICATIONS).await?;
        Ok::<_, sqlx::Error>(Some((partner, keys, notifications)))
    };
    let (partner, keys, notifications) = match read.await {
        Ok(Some(read)) => read,
        Ok(None) => {
            return layout::failure_page(crate::ApiError::NotFound(format!(
                "partner {partner_id} not found"
            )));
        }
        Err(error) => return layout::failure_page(error.into()),
    };
    let shows_key = outcome.as_ref().is_some_and(|o| o.new_key.is_some());
    let endpoint = EndpointState::of(&partner);
    let mut response = layout::page(
        &format!("Partner {}: {}", partner.id, partner.name),
        Some(&session.caller),
        html! {
            p { a href="/console/partners" { "← all partners" } }
            @if let Some(outcome) = &outcome {
                (outcome.flash)
                @if let Some(key) = &outcome.new_key {
                    p #new-key.flash role="status" {
                        "The new key, shown this once (only its hash is kept): "
                        code { (key) }
                    }
                }
            }
            section #endpoint data-state=(endpoint.name()) aria-labelledby="endpoint-heading" {
                h2 #endpoint-heading { "Webhook endpoint" }
                p {
                    (partner.webhook_url.as_deref().map(redact::text).unwrap_or_else(|| "none".to_owned()))
                    " · " span class=(format!("badge {}", endpoint.name())) { (endpoint.name().replace('_', " ")) }
                    " " (endpoint.describe(&partner))
                }
            }
            (keys_section(&partner, &keys))
            (notifications_section(&partner, &notifications))
        },
    )
    .into_response();
    if shows_key {
        // The page holds a usable secret: no cache, proxy or back button keeps it.
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn key_state(key: &KeyView, now: DateTime<Utc>) -> &'static str {
    match (key.revoked_at, key.expires_at) {
        (Some(_), _) => "revoked",
        (None, Some(expires)) if expires <= now => "expired",
        (None, Some(_)) => "expiring",
        (None, None) => "active",
    }
}

fn keys_section(partner: &Partner, keys: &[KeyView]) -> Markup {
    let now = Utc::now();
    let usable = keys
        .iter()
        .filter(|k| matches!(key_state(k, now), "active" | "expiring"))
        .count();
    let base = format!("/console/partners/{}/api-keys", partner.id);
    html! {
        section #keys aria-labelledby="keys-heading" {
            h2 #keys-heading { "API keys" }
            p.hint { (keys.len()) " key(s), " (usable) " usable. A key is never shown again after it is made; rotating one makes a new key and keeps the old one working for the overlap chosen." }
            @if !keys.is_empty() {
                (layout::wide_table("API keys", html! { table {
                    thead { tr { th.n scope="col" { "Key" } th scope="col" { "Label" } th scope="col" { "State" } th scope="col" { "Created" } th scope="col" { "Last used" } th scope="col" { "Expires" } th scope="col" { "Actions" } } }
                    tbody {
                        @for key in keys {
                            @let state = key_state(key, now);
                            @let name = key.label.clone().unwrap_or_else(|| format!("key {}", key.id));
                            tr.key data-id=(key.id) data-state=(state) {
                                td.n { "pbk_" (key.id) "_…" }
                                td { (key.label.as_deref().unwrap_or("")) }
                                td { span class=(format!("badge {state}")) { (state) }
                                    @if let Some(revoked) = key.revoked_at { " " (time(revoked)) } }
                                td { (time(key.created_at)) " by " (key.created_by) }
                                td.last-used { (key.last_used_at.map(time).unwrap_or_else(|| "never".to_owned())) }
                                td { (key.expires_at.map(time).unwrap_or_default()) }
                                td {
                                    @if matches!(state, "active" | "expiring") {
                                        form method="post" action=(format!("{base}/{}/rotate", key.id)) {
                                            label for=(format!("overlap-{}", key.id)) { "old key works for " }
                                            select id=(format!("overlap-{}", key.id)) name="overlap_seconds" {
                                                @for (seconds, label) in OVERLAPS {
                                                    option value=(seconds) { (label) }
                                                }
                                            }
                                            " "
                                            button type="submit" aria-label=(format!("Rotate {name}")) { "Rotate" }
                                        }
                                        form method="post" action=(format!("{base}/{}/revoke", key.id)) {
                                            button.danger type="submit" aria-label=(format!("Revoke {name}")) { "Revoke" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }))
            }
            form #new-key-form method="post" action=(base) {
                label for="new-key-label" { "New key's label " }
                input #new-key-label type="text" name="label" maxlength="190" placeholder="e.g. production, eu-west";
                " "
                button type="submit" { "Create a key" }
            }
        }
    }
}

fn notifications_section(partner: &Partner, notifications: &[NotificationWithAttempts]) -> Markup {
    html! {
        section #notifications aria-labelledby="notifications-heading" {
            h2 #notifications-heading { "Recent notifications" }
            p.hint { "The " (RECENT_NOTIFICATIONS) " newest, each with every POST made for it. A re-delivery sends it again under the same id, so the partner sees the same webhook-id and can deduplicate it." }
            @if notifications.is_empty() {
                p.flash { "No notification for this partner." }
            } @else {
                (layout::wide_table("Recent notifications", html! { table {
                    thead { tr { th.n scope="col" { "Id (webhook-id)" } th scope="col" { "Event" } th scope="col" { "About" } th scope="col" { "Status" } th scope="col" { "Created" } th scope="col" { "Delivery attempts" } th scope="col" { "Actions" } } }
                    tbody {
                        @for row in notifications {
                            @let n = &row.notification;
                            tr.notification data-id=(n.id) data-status=(n.status) {
                                td.n { (n.id) }
                                td { (n.event) }
                                td { (reference(&n.reference_type, n.reference_id)) }
                                td { span class=(format!("badge {}", n.status)) { (n.status) }
                                    @if let Some(next) = n.next_attempt_at.filter(|_| n.status == "PENDING") {
                                        " next attempt " (time(next))
                                    }
                                }
                                td { (time(n.created_at)) }
                                td {
                                    @if row.delivery_attempts.is_empty() {
                                        "none yet"
                                    } @else {
                                        ol.attempts {
                                            @for attempt in &row.delivery_attempts {
                                                li.attempt data-status-code=(attempt.status_code.map(|c| c.to_string()).unwrap_or_default()) {
                                                    (time(attempt.started_at)) " · "
                                                    (attempt.status_code.map(|c| format!("HTTP {c}")).unwrap_or_else(|| "no answer".to_owned()))
                                                    " · " (attempt.latency_ms) " ms"
                                                    @if let Some(error) = &attempt.error { " · " (error) }
                                                }
                                            }
                                        }
                                    }
                                }
                                td {
                                    @if n.status != "PENDING" {
                                        form method="post" action=(format!("/console/partners/{}/notifications/{}/redeliver", partner.id, n.id)) {
                                            button type="submit" aria-label=(format!("Re-deliver notification {}", n.id)) { "Re-deliver" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                } }))
            }
        }
    }
}

/// What a notification is about, linked to its trace when the trace knows the kind.
fn reference(kind: &str, id: u64) -> Markup {
    let trace = match kind {
        "WITHDRAWAL" => Some("withdrawal"),
        "DEPOSIT" => Some("deposit"),
        "P2P_DEPOSIT_ORDER" => Some("deposit-order"),
        _ => None,
    };
    html! {
        @match trace {
            Some(trace) => { a href=(format!("/console/trace?kind={trace}&id={id}")) { (kind.to_lowercase()) " " (id) } },
            None => { (kind.to_lowercase()) " " (id) },
        }
    }
}

/// Sends an action of a partner page and shows the page again with its outcome.
async fn act(
    state: &AppState,
    session: &Session,
    partner_id: u64,
    path: &str,
    body: Option<Value>,
    done: impl FnOnce(&Value) -> Outcome,
) -> Response {
    let answer = actions::call(state, session, Method::POST, path, body).await;
    let outcome = match answer.failure(&Method::POST, path) {
        Some(flash) => flash.into(),
        None => done(&answer.body),
    };
    render(state, session, partner_id, Some(outcome)).await
}

/// `POST /console/partners/{id}/notifications/{notification_id}/redeliver`.
pub(crate) async fn redeliver(
    State(state): State<AppState>,
    session: Session,
    path: Result<Path<(u64, u64)>, PathRejection>,
) -> Response {
    let (partner_id, id) = match path_ids(path) {
        Ok(ids) => ids,
        Err(error) => return layout::failure_page(error),
    };
    let path = format!("/v1/admin/partners/{partner_id}/notifications/{id}/redeliver");
    act(&state, &session, partner_id, &path, None, |_| {
        Flash::Done(format!(
            "Notification {id} queued for re-delivery under the same webhook-id."
        ))
        .into()
    })
    .await
}

/// `POST /console/partners/{id}/api-keys/{key_id}/revoke`.
pub(crate) async fn revoke_key(
    State(state): State<AppState>,
    session: Session,
    path: Result<Path<(u64, u64)>, PathRejection>,
) -> Response {
    let (partner_id, key_id) = match path_ids(path) {
        Ok(ids) => ids,
        Err(error) => return layout::failure_page(error),
    };
    let path = format!("/v1/admin/partners/{partner_id}/api-keys/{key_id}/revoke");
    act(&state, &session, partner_id, &path, None, |_| {
        Flash::Done(format!(
            "Key {key_id} revoked: refused from the next request on."
        ))
        .into()
    })
    .await
}

/// `POST /console/partners/{id}/api-keys/{key_id}/rotate` (form: `overlap_seconds`).
pub(crate) async fn rotate_key(
    State(state): State<AppState>,
    session: Session,
    path: Result<Path<(u64, u64)>, PathRejection>,
    form: FormFields,
) -> Response {
    let (partner_id, key_id) = match path_ids(path) {
        Ok(ids) => ids,
        Err(error) => return layout::failure_page(error),
    };
    let overlap = match form.get("overlap_seconds").map(str::parse::<u64>) {
        None => None,
        Some(Ok(seconds)) => Some(seconds),
        Some(Err(_)) => {
            return layout::error_page(
                axum::http::StatusCode::BAD_REQUEST,
                "overlap_seconds must be a whole number of seconds",
            );
        }
    };
    let path = format!("/v1/admin/partners/{partner_id}/api-keys/{key_id}/rotate");
    let body = json!({ "overlap_seconds": overlap });
    act(&state, &session, partner_id, &path, Some(body), |answer| {
        let expires = answer["old"]["expires_at"].as_str().unwrap_or("now");
        Outcome {
            flash: Flash::Done(format!(
                "Key {key_id} rotated: the old key works until {expires}."
            )),
            new_key: answer["new"]["key"].as_str().map(str::to_owned),
        }
    })
    .await
}

/// `POST /console/partners/{id}/api-keys` (form: `label`).
pub(crate) async fn create_key(
    State(state): State<AppState>,
    session: Session,
    id: Result<Path<u64>, PathRejection>,
    form: FormFields,
) -> Response {
    let partner_id = match path_id(id) {
        Ok(id) => id,
        Err(error) => return layout::failure_page(error),
    };
    let path = format!("/v1/admin/partners/{partner_id}/api-keys");
    let body = json!({ "label": form.get("label") });
    act(&state, &session, partner_id, &path, Some(body), |answer| {
        Outcome {
            flash: Flash::Done(format!(
                "Key {} created.",
                answer["id"].as_u64().unwrap_or_default()
            )),
            new_key: answer["key"].as_str().map(str::to_owned),
        }
    })
    .await
}
