//! Dead letters for ops (docs/operations.md), on `paybus_dead_letter_ops`: the same operations
//! as `paybus dead-letters`, as admin routes (`/v1/admin/dead-letters/…`: the groups, the list,
//! one letter, the dry run, replay and archive; each listed in docs/api.md, "Routes"). OPS reads
//! and dry-runs, ADMIN replays and archives; every action is recorded (`dead_letter_actions`)
//! under the caller.
//!
//! A replay sends only the letters still *safe* when it runs: the verdict is taken again under
//! each letter's lock, the message goes through the outbox, at most `per_second` a second and
//! `limit` a call (`remaining` says whether to call again).

pub(crate) mod operations;

use axum::{
    Extension, Json, Router,
    extract::{Path, Query, State, rejection::PathRejection, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use paybus_dead_letter_ops::{
    DeadLetter, DeadLetterDetail, DeadLetterError, DryRun, ExecuteOptions, ExecutionReport,
    LetterStatus, ListFilter, OperationAction, OperationDetail, OperationStatus, Overview,
    Selection, detail, groups, letter, operation, replay,
};
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState, admin::path_id, auth::Caller, body::JsonBody};

pub(crate) const MAX_LIMIT: u32 = letter::MAX_PAGE;
/// A replay answers within the request: 100 letters at 10 a second is ten seconds.
pub(crate) const DEFAULT_REPLAY_LIMIT: u32 = 100;
const MAX_PER_SECOND: f64 = 100.0;

/// The dead letters' part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(overview, list, show, dry_run, replay, archive))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/dead-letters", get(list))
        .route("/v1/admin/dead-letters/groups", get(overview))
        .route("/v1/admin/dead-letters/dry-run", get(dry_run))
        .route("/v1/admin/dead-letters/replay", post(replay))
        .route("/v1/admin/dead-letters/archive", post(archive))
        .route("/v1/admin/dead-letters/{id}", get(show))
        .merge(operations::admin_routes())
}

pub(crate) fn into_api(error: DeadLetterError) -> ApiError {
    match error {
        DeadLetterError::Database(e) => ApiError::Database(e),
        DeadLetterError::Outbox(e) => ApiError::Outbox(e),
        DeadLetterError::Invalid(message) => ApiError::BadRequest(message),
        DeadLetterError::NotFound(id) => {
            ApiError::NotFound(format!("dead letter {id} does not exist"))
        }
        DeadLetterError::OperationNotFound(_) => ApiError::NotFound(error.to_string()),
        DeadLetterError::SelfApproval(_) | DeadLetterError::NotAPerson(_) => {
            ApiError::NotYours(error.to_string())
        }
        DeadLetterError::OperationState { .. }
        | DeadLetterError::OperationTampered(_)
        | DeadLetterError::NothingSelected => ApiError::Conflict(error.to_string()),
        other @ DeadLetterError::Triage { .. } => ApiError::Internal(Box::new(other)),
    }
}

pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(query)| query)
        .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
}

pub(crate) fn limit(limit: Option<u32>, default: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::BadRequest(format!(
            "limit must be from 1 to {MAX_LIMIT}"
        )))
    }
}

#[utoipa::path(
    get,
    path = "/v1/admin/dead-letters/groups",
    tag = "dead-letters",
    security(("admin_token" = [])),
    responses((status = 200, description = "NEW letters grouped by function and reason, with the money at stake, biggest first", body = Object), crate::responses::AdminErrors)
)]
async fn overview(State(state): State<AppState>) -> Result<Json<Overview>, ApiError> {
    let overview = groups::overview(&state.pool, &state.dead_letters)
        .await
        .map_err(into_api)?;
    Ok(Json(overview))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    function: Option<String>,
    reason: Option<String>,
    /// NEW, REPLAYED or ARCHIVED.
    #[param(value_type = Option<String>)]
    status: Option<LetterStatus>,
    before_id: Option<u64>,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
struct LetterList {
    dead_letters: Vec<DeadLetter>,
    /// Pass as `before_id` for the next page; `null` on the last one.
    next_before_id: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/dead-letters",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(ListQuery),
    responses((status = 200, description = "Letters newest first; `next_before_id` continues", body = Object), crate::responses::AdminErrors)
)]
async fn list(
    State(state): State<AppState>,
    params: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LetterList>, ApiError> {
    let params = query(params)?;
    let limit = limit(params.limit, 50)?;
    let mut conn = state.pool.acquire().await?;
    let letters = letter::list(
        &mut conn,
        &ListFilter {
            function: params.function,
            reason: params.reason,
            status: params.status,
            before_id: params.before_id,
            limit: Some(limit),
        },
    )
    .await
    .map_err(into_api)?;
    let full = letters.len() == limit as usize;
    Ok(Json(LetterList {
        next_before_id: letters.last().filter(|_| full).map(|l| l.id),
        dead_letters: letters,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/admin/dead-letters/{id}",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The letter: headers, body, the rows it refers to, the verdict a replay would get, what ops did to it", body = Object), crate::responses::AdminErrors)
)]
async fn show(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<DeadLetterDetail>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    detail::show(&mut conn, &state.dead_letters, id)
        .await
        .map_err(into_api)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("dead letter {id} does not exist")))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DryRunQuery {
    /// Comma-separated letter ids.
    ids: Option<String>,
    function: Option<String>,
    reason: Option<String>,
    limit: Option<u32>,
}

impl DryRunQuery {
    fn selection(&self) -> Result<Selection, ApiError> {
        match (&self.ids, &self.function, &self.reason) {
            (Some(ids), None, None) => ids
                .split(',')
                .map(|id| id.trim().parse::<u64>())
                .collect::<Result<Vec<_>, _>>()
                .map(Selection::Ids)
                .map_err(|_| {
                    ApiError::BadRequest("ids must be comma-separated positive integers".into())
                }),
            (None, Some(function), Some(reason)) => Ok(Selection::Group {
                function: function.clone(),
                reason: reason.clone(),
            }),
            _ => Err(ApiError::BadRequest(
                "select letters with ids=1,2,3 or with function= and reason= (a group)".into(),
            )),
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/admin/dead-letters/dry-run",
    tag = "dead-letters",
    security(("admin_token" = [])),
    params(DryRunQuery),
    responses((status = 200, description = "Each NEW letter classified already_applied, safe or needs_human; nothing written", body = Object), crate::responses::AdminErrors)
)]
async fn dry_run(
    State(state): State<AppState>,
    params: Result<Query<DryRunQuery>, QueryRejection>,
) -> Result<Json<DryRun>, ApiError> {
    let params = query(params)?;
    let selection = params.selection()?;
    let limit = limit(params.limit, MAX_LIMIT)?;
    let run = replay::dry_run(&state.pool, &state.dead_letters, &selection, limit)
        .await
        .map_err(into_api)?;
    Ok(Json(run))
}

/// A group of letters in a request body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupName {
    function: String,
    reason: String,
}

/// `{"ids": [..]}` or `{"group": {..}}`, exactly one.
pub(crate) fn selection(
    ids: Option<Vec<u64>>,
    group: Option<GroupName>,
) -> Result<Selection, ApiError> {
    match (ids, group) {
        (Some(ids), None) => Ok(Selection::Ids(ids)),
        (None, Some(GroupName { function, reason })) => Ok(Selection::Group { function, reason }),
        _ => Err(ApiError::BadRequest(
            "select letters with \"ids\": [..] or with \"group\": {\"function\", \"reason\"} \
             (one of them)"
                .into(),
        )),
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    ids: Option<Vec<u64>>,
    group: Option<GroupName>,
    #[serde(default)]
    dry_run: bool,
    limit: Option<u32>,
    per_second: Option<f64>,
}

/// A replay's or an archive's answer: the dry run's when asked for one, what was done, or the
/// operation waiting for a second ADMIN.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ActionAnswer {
    DryRun(DryRun),
    Done(ExecutionReport),
    AwaitingApproval(OperationDetail),
}

impl IntoResponse for ActionAnswer {
    fn into_response(self) -> Response {
        let status = match self {
            ActionAnswer::AwaitingApproval(_) => StatusCode::ACCEPTED,
            _ => StatusCode::OK,
        };
        (status, Json(self)).into_response()
    }
}

pub(crate) fn per_second(per_second: Option<f64>) -> Result<f64, ApiError> {
    let per_second = per_second.unwrap_or(ExecuteOptions::default().per_second);
    if per_second > 0.0 && per_second <= MAX_PER_SECOND {
        Ok(per_second)
    } else {
        Err(ApiError::BadRequest(format!(
            "per_second must be above 0 and at most {MAX_PER_SECOND}"
        )))
    }
}

/// The one-call form of an operation: its dry run is frozen now and, unless four-eyes holds
/// it for a second ADMIN (then `202` with the operation), executed at once. `remaining`: NEW
/// letters of the selection beyond `limit`, for another call.
async fn request_and_execute(
    state: &AppState,
    caller: &Caller,
    action: OperationAction,
    selection: &Selection,
    options: ExecuteOptions,
) -> Result<ActionAnswer, ApiError> {
    let requested = {
        operation::request(
            &state.pool,
            &state.dead_letters,
            action,
            selection,
            &caller.actor,
            options.limit,
            &state.four_eyes,
        )
        .await
        .map_err(into_api)?
    };
    if requested.operation.status == OperationStatus::AwaitingApproval {
        return Ok(ActionAnswer::AwaitingApproval(requested));
    }
    let mut report = operation::execute(
        &state.outbox,
        &state.dead_letters,
        requested.operation.id,
        &caller.actor,
        options,
        |_| {},
    )
    .await
    .map_err(into_api)?;
    report.remaining += requested.not_included;
    Ok(ActionAnswer::Done(report))
}

#[utoipa::path(
    post,
    path = "/v1/admin/dead-letters/replay",
    tag = "dead-letters",
    security(("admin_token" = [])),
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "The dry run (dry_run: true), or what the replay did: replayed, already_applied, needs_human, remaining, and its operation", body = Object),
        (status = 202, description = "Four-eyes: the replay is an operation waiting for a second ADMIN's approval (nothing sent)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn replay(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(request): JsonBody<ReplayRequest>,
) -> Result<ActionAnswer, ApiError> {
    let selection = selection(request.ids, request.group)?;
    if request.dry_run {
        let limit = limit(request.limit, MAX_LIMIT)?;
        let run = replay::dry_run(&state.pool, &state.dead_letters, &selection, limit)
            .await
            .map_err(into_api)?;
        return Ok(ActionAnswer::DryRun(run));
    }
    let options = ExecuteOptions {
        per_second: per_second(request.per_second)?,
        limit: limit(request.limit, DEFAULT_REPLAY_LIMIT)?,
    };
    request_and_execute(
        &state,
        &caller,
        OperationAction::Replay,
        &selection,
        options,
    )
    .await
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ArchiveRequest {
    ids: Option<Vec<u64>>,
    group: Option<GroupName>,
    limit: Option<u32>,
}

#[utoipa::path(
    post,
    path = "/v1/admin/dead-letters/archive",
    tag = "dead-letters",
    security(("admin_token" = [])),
    request_body = ArchiveRequest,
    responses(
        (status = 200, description = "NEW letters of the selection ARCHIVED: archived, remaining, and its operation", body = Object),
        (status = 202, description = "Four-eyes: letters with money at stake wait for a second ADMIN's approval (nothing archived)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn archive(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(request): JsonBody<ArchiveRequest>,
) -> Result<ActionAnswer, ApiError> {
    let selection = selection(request.ids, request.group)?;
    let options = ExecuteOptions {
        // An archive sends nothing: no reason to pace it.
        per_second: MAX_PER_SECOND,
        limit: limit(request.limit, MAX_LIMIT)?,
    };
    request_and_execute(
        &state,
        &caller,
        OperationAction::Archive,
        &selection,
        options,
    )
    .await
}
