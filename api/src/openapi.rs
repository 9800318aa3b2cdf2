//! The OpenAPI 3 document, generated from the code (`GET /openapi.json`; shipped as
//! `api/openapi.json`, regenerated with `paybus openapi > api/openapi.json`).
//!
//! **Adding a route** (the one pattern, kept honest by `api/tests/openapi.rs`):
//! 1. register it in its module's router (`admin_routes()` / `payment_routes()` ...);
//! 2. annotate the handler with `#[utoipa::path(...)]`: method, path, `tag`, `params`,
//!    `request_body`, its success answers and the error set (`AdminErrors` for an admin
//!    route, with `security(("admin_token" = []))`; `SignedErrors` for a signed one — both
//!    in `crate::responses`, which route modules use without reaching back into this one);
//! 3. list the handler in its module's `Doc` (`#[openapi(paths(...))]`) — a new module adds
//!    its `Doc` to [`document`].
//!
//! The test fails for a route in a router that the document lacks, a documented operation the
//! router does not serve, or a shipped copy that differs from what the code generates.

use axum::{Json, Router, routing::get};
use utoipa::{
    Modify, OpenApi,
    openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme},
};

use crate::AppState;

/// The whole document: the shared parts below and every route module's `Doc`.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut document = ApiDoc::openapi();
    for part in [
        crate::confirmations::Doc::openapi(),
        crate::bonuses::Doc::openapi(),
        crate::partners::Doc::openapi(),
        crate::partner::Doc::openapi(),
        crate::partner::keys::Doc::openapi(),
        crate::audit::Doc::openapi(),
        crate::markets::Doc::openapi(),
        crate::p2p::Doc::openapi(),
        crate::dead_letters::Doc::openapi(),
        crate::dead_letters::operations::Doc::openapi(),
        crate::functions::Doc::openapi(),
        crate::ops_log::Doc::openapi(),
        crate::approvals::Doc::openapi(),
        crate::secrets::Doc::openapi(),
        crate::trace::route::Doc::openapi(),
        crate::overview::Doc::openapi(),
    ] {
        document.merge(part);
    }
    document
}

/// Served without a token: it describes the API, it grants nothing. (Route paths are string
/// literals everywhere, so `api/tests/openapi.rs` can read the route table from the source.)
pub(crate) fn routes() -> Router<AppState> {
    Router::new().route("/openapi.json", get(serve))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "paybus",
        description = "The paybus HTTP API: signed intake from the chain monitor and the payment \
            service, the partner API (each partner's own API key), and the admin API (role \
            tokens: OPS reads, ADMIN changes). Every error \
            answer is JSON `{\"error\": \"...\"}`; amounts are decimal strings.",
        license(name = "MIT", identifier = "MIT")
    ),
    paths(crate::health, crate::metrics, serve),
    modifiers(&SecuritySchemes),
    tags(
        (name = "service", description = "Liveness and this document"),
        (name = "intake", description = "confirmations (W2): chain-monitor confirmations (HMAC-signed)"),
        (name = "payments", description = "bonuses (W3): payment completions from every gateway (HMAC-signed)"),
        (name = "confirmations", description = "confirmations (W2) admin: withdrawals and deposits"),
        (name = "partners", description = "Admin: partners and their API keys"),
        (name = "partner", description = "The partner API: a partner's own orders, withdrawals, deposits, notifications and webhook (its API key; another partner's row is 404)"),
        (name = "bonuses", description = "bonuses (W3) admin: members, charges, charge events, bonus jobs"),
        (name = "p2p", description = "p2p (W1): P2P deposit orders (buyers) and withdraw orders (sellers' liquidity)"),
        (name = "markets", description = "markets (W4) admin: markets, orders, suspensions"),
        (name = "audit", description = "Every workflow's invariants, and the continuous auditor's passes"),
        (name = "dead-letters", description = "Ops: dead letters grouped, shown, dry-run, replayed, archived"),
        (name = "functions", description = "Ops: pause and resume a function's consumption"),
        (name = "approvals", description = "Ops: four-eyes — a guarded action requested by one ADMIN, approved by another, then executed"),
        (name = "ops-log", description = "Ops: every ops action, who did it, hash-chained (the audit verifies the chain)"),
    )
)]
struct ApiDoc;

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "service",
    responses((status = 200, description = "This document", body = Object))
)]
async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

/// The ways a caller proves who it is.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A role token from `paybus token issue` (HS256, signed with \
                         PAYBUS_ADMIN_JWT_SECRET): GET needs OPS or ADMIN, anything else ADMIN",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "partner_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("pbk_<key id>_<secret>")
                    .description(Some(
                        "A partner API key, created by an ADMIN \
                         (`POST /v1/admin/partners/{id}/api-keys`, shown once)",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "signature",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Paybus-Signature",
                "`t=<unix seconds>,v1=<hex HMAC-SHA256(secret, \"<t>.<body>\")>`",
            ))),
        );
    }
}
