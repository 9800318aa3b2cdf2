//! W4's routes (docs/workflows/markets.md, seed 004): markets and their orders (placement and fills stand in for
//! the order gateway and the matching engine), suspend, resume, and the suspension's progress.
//!
//! | route | does |
//! | --- | --- |
//! | `POST /v1/admin/markets` `{symbol}` | 201: an ACTIVE market |
//! | `GET /v1/admin/markets/{symbol}` | the market |
//! | `POST /v1/admin/markets/{symbol}/orders` `{account_id, side, price, quantity}` | 201: an OPEN order; 409 while the market is SUSPENDED |
//! | `GET /v1/admin/orders/{id}` | the order |
//! | `POST /v1/admin/orders/{id}/fills` `{quantity}` | 200: the order after the fill; 409 when not open or more than what is open |
//! | `POST /v1/admin/markets/{symbol}/suspend` `{note?}` (body optional) | 202 with the batch; 200 with the existing batch when already SUSPENDED (nothing created) |
//! | `POST /v1/admin/markets/{symbol}/resume` | 200; 409 while the cancellation is not complete |
//! | `GET /v1/admin/markets/{symbol}/suspension` | the latest suspension's progress |
//! | `POST /v1/admin/markets/{symbol}/suspension/retry-failed` | 200 `{retried}`: FAILED tasks back to PENDING |

use axum::{
    Extension, Json, Router,
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection, rejection::PathRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use paybus_markets::{
    MarketError, market,
    materialise::Plan,
    order::{self, NewOrder, Order, Side},
    progress::{self, Progress},
    suspension,
};
use paybus_ops::approvals::Guarded;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    ApiError, AppState, admin::path_id, amount::Amount, approvals, auth::Caller, body,
    body::JsonBody, chain,
};

/// W4's part of the OpenAPI document (see `crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(
    create_market,
    show_market,
    place_order,
    show_order,
    fill_order,
    suspend,
    resume,
    show_progress,
    retry_failed,
))]
pub(crate) struct Doc;

pub(crate) fn admin_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/markets", post(create_market))
        .route("/v1/admin/markets/{symbol}", get(show_market))
        .route("/v1/admin/markets/{symbol}/orders", post(place_order))
        .route("/v1/admin/orders/{id}", get(show_order))
        .route("/v1/admin/orders/{id}/fills", post(fill_order))
        .route("/v1/admin/markets/{symbol}/suspend", post(suspend))
        .route("/v1/admin/markets/{symbol}/resume", post(resume))
        .route("/v1/admin/markets/{symbol}/suspension", get(show_progress))
        .route(
            "/v1/admin/markets/{symbol}/suspension/retry-failed",
            post(retry_failed),
        )
}

impl From<MarketError> for ApiError {
    fn from(error: MarketError) -> Self {
        match error {
            MarketError::InvalidSymbol { .. } | MarketError::Invalid(_) => {
                ApiError::BadRequest(error.to_string())
            }
            MarketError::UnknownMarket(_)
            | MarketError::UnknownOrder(_)
            | MarketError::NeverSuspended(_) => ApiError::NotFound(error.to_string()),
            MarketError::DuplicateMarket(_)
            | MarketError::Suspended(_)
            | MarketError::NotOpen { .. }
            | MarketError::Overfill { .. }
            | MarketError::StillCancelling { .. }
            | MarketError::NotSuspended(_) => ApiError::Conflict(error.to_string()),
            MarketError::Database(e) => ApiError::Database(e),
            MarketError::Outbox(e) => ApiError::Outbox(e),
            MarketError::UnknownValue(_) => ApiError::Internal(Box::new(error)),
        }
    }
}

/// A `{symbol}` path segment, validated (400 names the rule it breaks).
fn path_symbol(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Ok(Path(symbol)) = path else {
        return Err(ApiError::BadRequest(
            "the symbol in the path is missing".to_owned(),
        ));
    };
    Ok(market::symbol(&symbol)?)
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewMarketRequest {
    symbol: String,
}

#[utoipa::path(
    post,
    path = "/v1/admin/markets",
    tag = "markets",
    security(("admin_token" = [])),
    request_body = NewMarketRequest,
    responses((status = 201, description = "An ACTIVE market", body = Object), crate::responses::AdminErrors)
)]
async fn create_market(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<NewMarketRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let mut conn = state.pool.acquire().await?;
    let id = market::create(&mut conn, &request.symbol).await?;
    tracing::info!(market_id = id, symbol = %request.symbol, "market created");
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "symbol": request.symbol, "status": "ACTIVE"})),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/admin/markets/{symbol}",
    tag = "markets",
    security(("admin_token" = [])),
    params(("symbol" = String, Path, description = "The market's symbol, e.g. BTC-USDT")),
    responses((status = 200, description = "The market", body = Object), crate::responses::AdminErrors)
)]
async fn show_market(
    State(state): State<AppState>,
    symbol: Result<Path<String>, PathRejection>,
) -> Result<Json<market::Market>, ApiError> {
    let symbol = path_symbol(symbol)?;
    let mut conn = state.pool.acquire().await?;
    market::find(&mut conn, &symbol)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound(format!("market {symbol} not found")))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewOrderRequest {
    account_id: u64,
    /// BUY or SELL.
    #[schema(value_type = String)]
    side: Side,
    price: Amount,
    quantity: Amount,
}

#[utoipa::path(
    post,
    path = "/v1/admin/markets/{symbol}/orders",
    tag = "markets",
    security(("admin_token" = [])),
    params(("symbol" = String, Path, description = "The market's symbol, e.g. BTC-USDT")),
    request_body = NewOrderRequest,
    responses((status = 201, description = "An OPEN order", body = Object), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(symbol, order_id))]
async fn place_order(
    State(state): State<AppState>,
    symbol: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<NewOrderRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let symbol = path_symbol(symbol)?;
    let new = NewOrder {
        account_id: chain::id("account_id", request.account_id)?,
        side: request.side,
        price: request.price.value(),
        quantity: request.quantity.value(),
    };
    let mut tx = state.pool.begin().await?;
    let id = order::place(&mut tx, &symbol, &new).await?;
    tx.commit().await?;
    tracing::Span::current().record("order_id", id);
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "symbol": symbol, "status": "OPEN"})),
    ))
}

#[utoipa::path(
    get,
    path = "/v1/admin/orders/{id}",
    tag = "markets",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    responses((status = 200, description = "The order", body = Object), crate::responses::AdminErrors)
)]
async fn show_order(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Order>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    order::find(&mut conn, id)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound(format!("order {id} not found")))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct FillRequest {
    quantity: Amount,
}

#[utoipa::path(
    post,
    path = "/v1/admin/orders/{id}/fills",
    tag = "markets",
    security(("admin_token" = [])),
    params(("id" = u64, Path, description = "The row's id (a positive integer)")),
    request_body = FillRequest,
    responses((status = 200, description = "The order after the fill", body = Object), crate::responses::AdminErrors)
)]
async fn fill_order(
    State(state): State<AppState>,
    id: Result<Path<u64>, PathRejection>,
    JsonBody(request): JsonBody<FillRequest>,
) -> Result<Json<Order>, ApiError> {
    let id = path_id(id)?;
    let mut tx = state.pool.begin().await?;
    match order::fill(&mut tx, id, request.quantity.value()).await {
        Ok(order) => {
            tx.commit().await?;
            Ok(Json(order))
        }
        Err(error) => {
            tx.rollback().await?;
            Err(error.into())
        }
    }
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SuspendRequest {
    /// Why ops suspended the market (kept on the batch).
    #[serde(default)]
    note: Option<String>,
}

/// 202 with the new batch (tasks are created and cancelled after the answer), or 200 with the
/// existing one when the market was SUSPENDED already.
#[utoipa::path(
    post,
    path = "/v1/admin/markets/{symbol}/suspend",
    tag = "markets",
    security(("admin_token" = [])),
    params(("symbol" = String, Path, description = "The market's symbol, e.g. BTC-USDT")),
    request_body(content = Option<SuspendRequest>, description = "Optional"),
    responses((status = 202, description = "Suspended now: the new batch", body = Object),
        (status = 200, description = "Already SUSPENDED: the existing batch, nothing created", body = Object), crate::responses::AdminErrors)
)]
#[tracing::instrument(skip_all, fields(symbol))]
async fn suspend(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    symbol: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let symbol = path_symbol(symbol)?;
    let raw = body::bytes(raw)?;
    let request: SuspendRequest = if raw.iter().all(u8::is_ascii_whitespace) {
        SuspendRequest::default()
    } else {
        body::json(&raw)?
    };
    let suspension = suspension::suspend(
        &state.outbox,
        &symbol,
        request.note.as_deref(),
        &Plan::default(),
        &caller.actor,
    )
    .await?;
    let status = if suspension.suspended_now {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let mut answer =
        serde_json::to_value(&suspension).map_err(|e| ApiError::Internal(Box::new(e)))?;
    answer["status"] = json!("SUSPENDED");
    answer["progress"] = json!(format!("/v1/admin/markets/{symbol}/suspension"));
    Ok((status, Json(answer)))
}

#[utoipa::path(
    post,
    path = "/v1/admin/markets/{symbol}/resume",
    tag = "markets",
    security(("admin_token" = [])),
    params(("symbol" = String, Path, description = "The market's symbol, e.g. BTC-USDT")),
    responses(
        (status = 200, description = "ACTIVE", body = Object),
        (status = 202, description = "Four-eyes: an approval a second ADMIN gives before the market resumes (`/v1/admin/approvals`)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    symbol: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let symbol = path_symbol(symbol)?;
    guarded(&state, &caller, Guarded::MarketResume, &symbol).await
}

/// A guarded market action (`Guarded::MarketResume`, `Guarded::SuspensionRetry`): held for a
/// second ADMIN under four-eyes when the market is SUSPENDED (on an active or unknown market
/// it changes nothing, so it runs and says so), else run now.
async fn guarded(
    state: &AppState,
    caller: &Caller,
    action: Guarded,
    symbol: &str,
) -> Result<Response, ApiError> {
    let subject = format!("market:{symbol}");
    if state.four_eyes.requires(action) {
        let mut conn = state.pool.acquire().await?;
        let current = market::find(&mut conn, symbol)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("market {symbol} not found")))?;
        if current.status == market::MarketStatus::Suspended
            && let Some(held) = approvals::held(state, caller, action, &subject).await?
        {
            return Ok(held.into_response());
        }
    }
    let done = approvals::run(&state.outbox, action, &subject, &caller.actor).await?;
    Ok(Json(done).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/admin/markets/{symbol}/suspension",
    tag = "markets",
    security(("admin_token" = [])),
    params(("symbol" = String, Path, description = "The market's symbol, e.g. BTC-USDT")),
    responses((status = 200, description = "The latest suspension's progress", body = Object), crate::responses::AdminErrors)
)]
async fn show_progress(
    State(state): State<AppState>,
    symbol: Result<Path<String>, PathRejection>,
) -> Result<Json<Progress>, ApiError> {
    let symbol = path_symbol(symbol)?;
    Ok(Json(progress::of_symbol(&state.pool, &symbol).await?))
}

#[utoipa::path(
    post,
    path = "/v1/admin/markets/{symbol}/suspension/retry-failed",
    tag = "markets",
    security(("admin_token" = [])),
    params(("symbol" = String, Path, description = "The market's symbol, e.g. BTC-USDT")),
    responses(
        (status = 200, description = "`{symbol, retried}`: FAILED tasks back to PENDING", body = Object),
        (status = 202, description = "Four-eyes: an approval a second ADMIN gives before the tasks run again (`/v1/admin/approvals`)", body = Object),
        crate::responses::AdminErrors
    )
)]
async fn retry_failed(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    symbol: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let symbol = path_symbol(symbol)?;
    guarded(&state, &caller, Guarded::SuspensionRetry, &symbol).await
}
