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
    openapi::security::{
        ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, OpenIdConnect, SecurityRequirement,
        SecurityScheme,
    },
};

use crate::AppState;

/// The whole document: the shared parts below and every route module's `Doc`.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut document = ApiDoc::openapi();
    for part in [
        crate::confirmations::Doc::openapi(),
        crate::bonuses::Doc::openapi(),
        crate::partners::Doc::openapi(),
        crate::partner_api::Doc::openapi(),
        crate::partners::keys::Doc::openapi(),
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
        crate::activity::Doc::openapi(),
        crate::search::Doc::openapi(),
        crate::oidc::route::Doc::openapi(),
        crate::console_sessions::Doc::openapi(),
    ] {
        document.merge(part);
    }
    let break_glass = SecurityRequirement::new("admin_token", Vec::<String>::new());
    let person = SecurityRequirement::new("oidc", Vec::<String>::new());
    // Every admin route takes a person's token as well as break-glass: declared once here
    // rather than on each route's annotation.
    for item in document.paths.paths.values_mut() {
        for operation in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(security) = operation.security.as_mut()
                && security.contains(&break_glass)
                && !security.contains(&person)
            {
                security.insert(0, person.clone());
            }
        }
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
            service, the partner API (each partner's own API key), and the admin API (a \
            person's token from the identity provider, or a marked break-glass token; OPS \
            reads, ADMIN changes). Every error \
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
        (name = "console-sessions", description = "ADMIN: the web console's active sessions (who is signed in), and ending one"),
    )
)]
struct ApiDoc;

/// The `oidc` scheme's discovery URL in the shipped document; the served one names the
/// configured provider's.
const OIDC_DISCOVERY_PLACEHOLDER: &str =
    "https://identity-provider.example/.well-known/openid-configuration";

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "service",
    responses((status = 200, description = "This document", body = Object))
)]
async fn serve(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Json<utoipa::openapi::OpenApi> {
    let mut document = document();
    if let Some(provider) = state.oidc.as_ref()
        && let Some(components) = document.components.as_mut()
        && let Some(SecurityScheme::OpenIdConnect(scheme)) =
            components.security_schemes.get_mut("oidc")
    {
        scheme.open_id_connect_url = format!(
            "{}/.well-known/openid-configuration",
            provider.config().issuer
        );
    }
    Json(document)
}

/// The ways a caller proves who it is.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "oidc",
            SecurityScheme::OpenIdConnect(OpenIdConnect::with_description(
                OIDC_DISCOVERY_PLACEHOLDER,
                "A person's access token from the company's identity provider \
                 (`PAYBUS_OIDC_ISSUER`; `paybus login`, or the console's sign-in), as a bearer \
                 token; roles from the claim `PAYBUS_OIDC_ROLES_CLAIM` names: GET needs OPS or \
                 ADMIN, anything else ADMIN. The served document names the configured \
                 provider's discovery document",
            )),
        );
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "Break-glass: a token from `paybus token issue` (HS256, signed with \
                         PAYBUS_ADMIN_JWT_SECRET), taken only while PAYBUS_BREAK_GLASS is on; \
                         every action with one is marked, and none is one of four eyes",
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
