//! W2's partner routes: a partner reads its own withdrawals (with their status history) and
//! deposits. Another partner's row answers 404, as a missing one does.

use axum::{
    Extension, Json,
    extract::{Path, State, rejection::PathRejection},
};
use paybus_confirmations::{
    deposit::{self, Deposit},
    withdrawal,
};

use super::PartnerIdentity;
use crate::{
    ApiError, AppState,
    admin::path_id,
    confirmations::{WithdrawalView, internal},
};

#[utoipa::path(
    get,
    path = "/v1/partner/withdrawals/{id}",
    tag = "partner",
    security(("partner_key" = [])),
    params(("id" = u64, Path, description = "The withdrawal's id (a positive integer)")),
    responses(
        (status = 200, description = "The withdrawal with its status history", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn show_withdrawal(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<WithdrawalView>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    let found = withdrawal::find_for_partner(&mut conn, partner.partner_id, id)
        .await
        .map_err(internal)?;
    // The history is read only for a withdrawal found under this partner: it is this
    // partner's too.
    WithdrawalView::with_history(&mut conn, id, found).await
}

#[utoipa::path(
    get,
    path = "/v1/partner/deposits/{id}",
    tag = "partner",
    security(("partner_key" = [])),
    params(("id" = u64, Path, description = "The deposit's id (a positive integer)")),
    responses(
        (status = 200, description = "The deposit", body = Object),
        crate::responses::PartnerErrors
    )
)]
pub(super) async fn show_deposit(
    State(state): State<AppState>,
    Extension(partner): Extension<PartnerIdentity>,
    id: Result<Path<u64>, PathRejection>,
) -> Result<Json<Deposit>, ApiError> {
    let id = path_id(id)?;
    let mut conn = state.pool.acquire().await?;
    deposit::find_for_partner(&mut conn, partner.partner_id, id)
        .await
        .map_err(internal)?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("deposit {id} not found")))
}
