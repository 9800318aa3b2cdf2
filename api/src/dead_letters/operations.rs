//! Dead-letter operations (`paybus_dead_letter_ops::operation`) as admin routes: a dry run
//! frozen into an operation (`POST /v1/admin/dead-letters/operations`: each letter's verdict, a
//! hash and an expiry; letters that arrive afterwards are not in it), listed and shown with its
//! progress, approved by a second ADMIN by the hash they saw (`…/{id}/approve`, when four-eyes
//! asks for it), and executed once (`…/{id}/execute`: at most `limit` letters a call, called
//! again while `remaining` > 0, which is also how a call cut short resumes). Each route's
//! answers are in docs/api.md ("Routes").

use axum::{
    Extension, Json, Router,
    extract::{Path, Query, State, rejection::PathRejection, rejection::QueryRejection},
    http::StatusCode,
    routing::{get, post},
};
use paybus_dead_letter_ops::{
    ExecuteOptions, ExecutionReport, Operation, OperationAction, OperationDetail, operation,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{DEFAULT_REPLAY_LIMIT, GroupName, MAX_LIMIT, into_api, limit, per_second, selection};
use crate::{ApiError, AppState, auth::Caller, body::JsonBody};

#[derive(utoipa::OpenApi)]
#[openapi(paths(request, list, show, approve, execute))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/dead-letters/operations", get(list).post(request))
        .route("/v1/admin/dead-letters/operations/{id}", get(show))
        .route(
            "/v1/admin/dead-letters/operations/{id}/approve",
            post(approve),
        )
        .route(
            "/v1/admin/dead-letters/operations/{id}/execute",
            post(execute),
        )
}

fn operation_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    path.ok()
        .and_then(|Path(id)| Uuid::parse_str(&id).ok())
        .ok_or_else(|| ApiError::BadRequest("the operation id must be a UUID".to_owned()))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct OperationRequest {
    /// `replay` or `archive`.
    action: String,
    ids: Option<Vec<u64>>,
    group: Option<GroupName>,
    limit: Option<u32>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/dead-letters/operations",
    tag = "dead-letters",
    security(("admin_token" = [])),
    request_body = OperationRequest,
    responses((status = 201, description = "The operation: its letters with their verdicts, its hash, its expiry, AWAITING_APPROVAL or READY", body = Object), crate::responses::AdminErrors)
)]
async fn request(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<OperationRequest>,
) -> Result<(StatusCode, Json<OperationDetail>), ApiError> {
    let action: OperationAction = body
        .action
        .parse()
        .map_err(|_| ApiError::BadRequest("action must be replay or archive".to_owned()))?;
    let selection = selection(body.ids, body.group)?;
    let limit = limit(body.limit, MAX_LIMIT)?;
    let detail = operation::request(
        &state.pool,
        &state.dead_letters,
        action,
        &selection,
        &caller.actor,
        limit,
        &state.four_eyes,
    )
    .await
    .map_err(into_api)?;
    Ok((StatusCode::CREATED, Json(detail)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
struct OperationList {
    operations: Vec<Operation>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/dead-letters/operations",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(ListQuery),
    responses((status = 200, description = "Recent operations, newest first", body = Object), crate::responses::AdminErrors)
)]
async fn list(
    State(state): State<AppState>,
    params: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<OperationList>, ApiError> {
    let params = super::query(params)?;
    let limit = limit(params.limit, 50)?;
    let mut conn = state.pool.acquire().await?;
    let operations = operation::list(&mut conn, limit).await.map_err(into_api)?;
    Ok(Json(OperationList { operations }))
}

#[utoipa::path(
    get,
    path = "/v1/admin/dead-letters/operations/{id}",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The operation's id (a UUID)")),
    responses((status = 200, description = "The operation with its letters' verdicts and results", body = Object), crate::responses::AdminErrors)
)]
async fn show(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<OperationDetail>, ApiError> {
    let id = operation_id(id)?;
    let mut conn = state.pool.acquire().await?;
    operation::show(&mut conn, id)
        .await
        .map_err(into_api)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("operation {id} does not exist")))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ApproveRequest {
    /// The operation's `content_hash`, as the approver saw it.
    hash: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/dead-letters/operations/{id}/approve",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The operation's id (a UUID)")),
    request_body = ApproveRequest,
    responses((status = 200, description = "Approved: READY", body = Object), crate::responses::AdminErrors)
)]
async fn approve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody<ApproveRequest>,
) -> Result<Json<Operation>, ApiError> {
    let id = operation_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let approved = operation::approve(&mut conn, id, &caller.actor, &body.hash)
        .await
        .map_err(into_api)?;
    Ok(Json(approved))
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ExecuteRequest {
    per_second: Option<f64>,
    limit: Option<u32>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/dead-letters/operations/{id}/execute",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The operation's id (a UUID)")),
    request_body = ExecuteRequest,
    responses((status = 200, description = "What this call did, letter by letter, and what remains", body = Object), crate::responses::AdminErrors)
)]
async fn execute(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody<ExecuteRequest>,
) -> Result<Json<ExecutionReport>, ApiError> {
    let id = operation_id(id)?;
    let options = ExecuteOptions {
        per_second: per_second(body.per_second)?,
        limit: limit(body.limit, DEFAULT_REPLAY_LIMIT)?,
    };
    let report = operation::execute(
        &state.outbox,
        &state.dead_letters,
        id,
        &caller.actor,
        options,
        |_| {},
    )
    .await
    .map_err(into_api)?;
    Ok(Json(report))
}
