//! Ops' switch for a function's consumption (`paybus_bus::pauses`): every process's
//! consumers of a paused function stop taking deliveries within a couple of seconds; the
//! messages wait in its queue and are drained on resume.
//!
//! | route | does |
//! | --- | --- |
//! | `GET /v1/admin/functions` | every catalog function, paused or not (who, why, since when) |
//! | `POST /v1/admin/functions/{name}/pause` `{reason}` | 200 `{paused_now}`; 404 for a name the catalog lacks |
//! | `POST /v1/admin/functions/{name}/resume` | 200 `{resumed_now}`; 404 likewise |

use axum::{
    Extension, Json, Router,
    extract::{Path, State, rejection::PathRejection},
    routing::{get, post},
};
use paybus_bus::pauses::{self, Pause};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{ApiError, AppState, auth::Caller, body::JsonBody};

/// The functions' part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, pause, resume), components(schemas(PauseRequest)))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/functions", get(list))
        .route("/v1/admin/functions/{name}/pause", post(pause))
        .route("/v1/admin/functions/{name}/resume", post(resume))
}

/// One catalog function and its pause, if any.
#[derive(Debug, Serialize)]
struct FunctionState {
    name: &'static str,
    queue: String,
    paused: Option<Pause>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/functions",
    tag = "functions",
    security(("admin_token" = [])),
    responses((status = 200, description = "Every function of the catalog with its pause (`null`: consuming)", body = Object), crate::responses::AdminErrors)
)]
async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut conn = state.pool.acquire().await?;
    let paused = pauses::list(&mut conn).await?;
    let functions: Vec<FunctionState> = state
        .functions
        .iter()
        .map(|function| FunctionState {
            name: function.name,
            queue: function.queue.queue(),
            paused: paused
                .iter()
                .find(|p| p.function_name == function.name)
                .cloned(),
        })
        .collect();
    Ok(Json(json!({ "functions": functions })))
}

/// Why the function is paused (kept with the pause and shown to whoever looks).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PauseRequest {
    reason: String,
}

/// The catalog's name for `name`, or 404.
fn catalog_name(
    state: &AppState,
    name: Result<Path<String>, PathRejection>,
) -> Result<&'static str, ApiError> {
    let Path(name) = name.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    state
        .functions
        .iter()
        .find(|function| function.name == name)
        .map(|function| function.name)
        .ok_or_else(|| ApiError::NotFound(format!("no function {name:?} in the catalog")))
}

#[utoipa::path(
    post,
    path = "/v1/admin/functions/{name}/pause",
    tag = "functions",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "A catalog function, e.g. confirm-withdrawal")),
    request_body = PauseRequest,
    responses((status = 200, description = "Paused: `paused_now` false when it was paused already", body = Object), crate::responses::AdminErrors)
)]
async fn pause(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    name: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<PauseRequest>,
) -> Result<Json<Value>, ApiError> {
    let name = catalog_name(&state, name)?;
    let reason = request.reason.trim();
    if reason.is_empty() {
        return Err(ApiError::BadRequest(
            "say why the function is paused (\"reason\"): whoever finds it paused reads it".into(),
        ));
    }
    let mut conn = state.pool.acquire().await?;
    let paused_now = pauses::pause(&mut conn, name, &caller.actor, reason).await?;
    Ok(Json(
        json!({ "function": name, "paused": true, "paused_now": paused_now }),
    ))
}

#[utoipa::path(
    post,
    path = "/v1/admin/functions/{name}/resume",
    tag = "functions",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "A catalog function, e.g. confirm-withdrawal")),
    responses((status = 200, description = "Consuming again: `resumed_now` false when it was not paused", body = Object), crate::responses::AdminErrors)
)]
async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = catalog_name(&state, name)?;
    let mut conn = state.pool.acquire().await?;
    let resumed_now = pauses::resume(&mut conn, name, &caller.actor).await?;
    Ok(Json(
        json!({ "function": name, "paused": false, "resumed_now": resumed_now }),
    ))
}
