//! Four-eyes for the single guarded actions (`paybus_ops::approvals`): retrying a FAILED
//! bonus job, re-running a suspension's FAILED tasks, resuming a market. Under four-eyes their
//! routes answer `202` with an approval instead of acting; a second ADMIN approves it and then
//! anyone with ADMIN executes it here — the same action, through [`run`], the one code path the
//! direct routes and `paybus approvals execute` take too.
//!
//! - `GET /v1/admin/approvals[?awaiting=true][&limit=50]`: newest first.
//! - `GET /v1/admin/approvals/{id}`.
//! - `POST /v1/admin/approvals/{id}/approve`: `403` for the requester, `409` when it is not
//!   awaiting approval, expired, or not the open request for its action and subject.
//! - `POST /v1/admin/approvals/{id}/execute`: runs the action once approved, however many
//!   callers execute it at once; every answer carries the result recorded by the one that ran
//!   it (`ran_now` says which); `409` while awaiting approval, once expired, or while another
//!   execution has not recorded its result within `approvals::RESULT_WAIT`.

use axum::{
    Extension, Json, Router,
    extract::{Path, Query, State, rejection::PathRejection, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use paybus_bonuses::job::{self, OpsRetry};
use paybus_bus::Outbox;
use paybus_markets::suspension::{self, Resumed};
use paybus_ops::{
    actor::Actor,
    approvals::{self, Approval, ApprovalError, Guarded, Turn},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::{ApiError, AppState, auth::Caller};

#[derive(utoipa::OpenApi)]
#[openapi(paths(list, show, approve, execute))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/approvals", get(list))
        .route("/v1/admin/approvals/{id}", get(show))
        .route("/v1/admin/approvals/{id}/approve", post(approve))
        .route("/v1/admin/approvals/{id}/execute", post(execute))
}

pub(crate) fn into_api(error: ApprovalError) -> ApiError {
    match error {
        ApprovalError::Database(e) => ApiError::Database(e),
        ApprovalError::NotFound(_) => ApiError::NotFound(error.to_string()),
        ApprovalError::SelfApproval(_) | ApprovalError::NotAPerson(_) => {
            ApiError::NotYours(error.to_string())
        }
        ApprovalError::State { .. } | ApprovalError::Contended { .. } => {
            ApiError::Conflict(error.to_string())
        }
        other @ ApprovalError::Unknown { .. } => ApiError::Internal(Box::new(other)),
    }
}

/// The answer of a guarded route held for a second ADMIN: `202` with the approval (awaiting
/// approval, or already approved when it was asked for before).
pub(crate) struct Held(pub Approval);

impl IntoResponse for Held {
    fn into_response(self) -> Response {
        (StatusCode::ACCEPTED, Json(json!({ "approval": self.0 }))).into_response()
    }
}

/// Under four-eyes for `action`, the approval request (new, or the open one for the same
/// action and subject, awaiting approval or approved); `None` when the action may run now.
pub(crate) async fn held(
    state: &AppState,
    caller: &Caller,
    action: Guarded,
    subject: &str,
) -> Result<Option<Held>, ApiError> {
    if !state.four_eyes.requires(action) {
        return Ok(None);
    }
    let mut conn = state.pool.acquire().await?;
    let approval = approvals::request(
        &mut conn,
        action,
        subject,
        &caller.actor,
        state.four_eyes.ttl,
    )
    .await
    .map_err(into_api)?;
    Ok(Some(Held(approval)))
}

/// Runs guarded `action` on `subject` as `actor` and says what it did (the direct routes, an
/// approval's execution and the CLI all come here). A client's mistake (a job that is not
/// FAILED, an unknown market) is its error.
pub async fn run(
    outbox: &Outbox,
    action: Guarded,
    subject: &str,
    actor: &Actor,
) -> Result<Value, ApiError> {
    let bad_subject = || ApiError::BadRequest(format!("{action} cannot act on {subject:?}"));
    match action {
        Guarded::JobRetry => {
            let id: u64 = subject
                .strip_prefix("charge_event_job:")
                .and_then(|id| id.parse().ok())
                .ok_or_else(bad_subject)?;
            match job::retry_by_ops(outbox, id, actor)
                .await
                .map_err(ApiError::from)?
            {
                OpsRetry::Retried(job) => Ok(json!(job)),
                OpsRetry::NotFailed(job) => Err(ApiError::Conflict(format!(
                    "bonus job {id} is {}, not FAILED: only a FAILED job can be retried; \
                     nothing changed",
                    job.status
                ))),
                OpsRetry::Missing => Err(ApiError::NotFound(format!("bonus job {id} not found"))),
            }
        }
        Guarded::SuspensionRetry => {
            let symbol = subject.strip_prefix("market:").ok_or_else(bad_subject)?;
            let retried = suspension::retry_failed(outbox.pool(), symbol, actor).await?;
            Ok(json!({"symbol": symbol, "retried": retried}))
        }
        Guarded::MarketResume => {
            let symbol = subject.strip_prefix("market:").ok_or_else(bad_subject)?;
            let resumed = suspension::resume(outbox.pool(), symbol, actor).await?;
            Ok(json!({
                "symbol": symbol,
                "status": "ACTIVE",
                "resumed_now": resumed == Resumed::Resumed,
            }))
        }
        // Dead letters are approved as their operation (`/v1/admin/dead-letters/operations`).
        Guarded::Replay | Guarded::Archive => Err(bad_subject()),
    }
}

fn approval_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    path.ok()
        .and_then(|Path(id)| Uuid::parse_str(&id).ok())
        .ok_or_else(|| ApiError::BadRequest("the approval id must be a UUID".to_owned()))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only those waiting for a second ADMIN.
    #[serde(default)]
    awaiting: bool,
    limit: Option<u32>,
}

#[derive(Debug, Serialize)]
struct ApprovalList {
    approvals: Vec<Approval>,
}

#[utoipa::path(
    get,
    path = "/v1/admin/approvals",
    tag = "approvals",
    security(("admin_token" = [])),
    params(ListQuery),
    responses((status = 200, description = "Approvals of guarded actions, newest first", body = Object), crate::responses::AdminErrors)
)]
async fn list(
    State(state): State<AppState>,
    params: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ApprovalList>, ApiError> {
    let Query(params) = params.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    let limit = params.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::BadRequest(
            "limit must be from 1 to 500".to_owned(),
        ));
    }
    let mut conn = state.pool.acquire().await?;
    let approvals = approvals::list(&mut conn, params.awaiting, limit)
        .await
        .map_err(into_api)?;
    Ok(Json(ApprovalList { approvals }))
}

#[utoipa::path(
    get,
    path = "/v1/admin/approvals/{id}",
    tag = "approvals",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The approval's id (a UUID)")),
    responses((status = 200, description = "The approval", body = Object), crate::responses::AdminErrors)
)]
async fn show(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Approval>, ApiError> {
    let id = approval_id(id)?;
    let mut conn = state.pool.acquire().await?;
    approvals::show(&mut conn, id)
        .await
        .map_err(into_api)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("approval {id} does not exist")))
}

#[utoipa::path(
    post,
    path = "/v1/admin/approvals/{id}/approve",
    tag = "approvals",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The approval's id (a UUID)")),
    responses((status = 200, description = "Approved: it may be executed", body = Object), crate::responses::AdminErrors)
)]
async fn approve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Approval>, ApiError> {
    let id = approval_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let approved = approvals::approve(&mut conn, id, &caller.actor)
        .await
        .map_err(into_api)?;
    Ok(Json(approved))
}

/// The answer to an execute: the same recorded result for every caller, whoever ran it.
#[derive(Debug, Serialize)]
pub struct Executed {
    pub approval: Approval,
    /// What the execution recorded that the action did (the approval's `result`, as JSON).
    pub result: Value,
    /// Whether this call ran the action; the others waited for its result or came later.
    pub ran_now: bool,
}

impl Executed {
    fn recorded(approval: Approval, ran_now: bool) -> Self {
        let result = approval.result.as_deref().map_or(Value::Null, |text| {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
        });
        Self {
            approval,
            result,
            ran_now,
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/admin/approvals/{id}/execute",
    tag = "approvals",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The approval's id (a UUID)")),
    responses((status = 200, description = "The approved action ran (or had run): the approval and what it did", body = Object), crate::responses::AdminErrors)
)]
async fn execute(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Executed>, ApiError> {
    let id = approval_id(id)?;
    Ok(Json(
        execute_approval(&state.outbox, id, &caller.actor).await?,
    ))
}

/// Executes approval `id` as `actor` (the API's route and `paybus approvals execute`): the
/// claim, then the action and its record — or, for every caller that did not win the claim,
/// the result recorded by the one that did (see `paybus_ops::approvals`).
pub async fn execute_approval(
    outbox: &Outbox,
    id: Uuid,
    actor: &Actor,
) -> Result<Executed, ApiError> {
    let claim = {
        let mut conn = outbox.pool().acquire().await?;
        match approvals::claim(&mut conn, id).await.map_err(into_api)? {
            Turn::Ran(approval) => return Ok(Executed::recorded(approval, false)),
            Turn::Run(claim) => claim,
        }
    };
    let approval = &claim.approval;
    let result = match run(outbox, approval.action, &approval.subject, actor).await {
        Ok(result) => result,
        // The action refused (e.g. the job is no longer FAILED): that is what it did.
        Err(refused @ (ApiError::Conflict(_) | ApiError::NotFound(_))) => {
            json!({"refused": refused.to_string()})
        }
        Err(failed) => {
            // Whether the action committed is unknown; it is conditional, so the next
            // execution may simply run it again, without waiting for the lease.
            let released = match outbox.pool().acquire().await {
                Ok(mut conn) => approvals::release(&mut conn, &claim)
                    .await
                    .map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            };
            if let Err(error) = released {
                tracing::warn!(approval = %id, %error,
                    "four-eyes: the claim stays until its lease passes");
            }
            return Err(failed);
        }
    };
    let mut conn = outbox.pool().acquire().await?;
    let executed = approvals::executed(&mut conn, &claim, actor, &summary(&result).to_string())
        .await
        .map_err(into_api)?;
    Ok(Executed::recorded(executed, true))
}

/// What an approval keeps of an action's answer: the fields that say what it did (a retried
/// job's whole row would drown it).
fn summary(result: &Value) -> Value {
    const SAYS: [&str; 7] = [
        "id",
        "status",
        "retry_count",
        "symbol",
        "retried",
        "resumed_now",
        "refused",
    ];
    let Some(fields) = result.as_object() else {
        return result.clone();
    };
    Value::Object(
        fields
            .iter()
            .filter(|(key, _)| SAYS.contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    )
}
