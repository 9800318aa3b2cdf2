//! The audit page: every workflow's invariants, checked now in one snapshot (the same checks
//! and the same code as `GET /v1/admin/audit` and `paybus audit`).

use axum::{
    extract::State,
    response::{IntoResponse, Response},
};
use maud::html;

use super::{Session, layout};
use crate::AppState;

/// `GET /console/audit`.
pub(crate) async fn page(State(state): State<AppState>, session: Session) -> Response {
    let report = match crate::audit::report(&state).await {
        Ok(report) => report,
        Err(error) => return layout::failure_page(error),
    };
    layout::page(
        "Audit",
        Some(&session),
        html! {
            p.hint { (state.audit.len()) " checks, every workflow's, run now in one snapshot." }
            @if report.clean {
                p.flash #audit-status data-clean="true" { "Audit clean: no invariant is violated." }
            } @else {
                p.flash.error #audit-status data-clean="false" {
                    "Audit found " (report.violations.len()) " violation(s)."
                }
                table {
                    thead { tr { th { "Check" } th { "What" } } }
                    tbody {
                        @for violation in &report.violations {
                            tr { td { code { (violation.check) } } td { (violation.description) } }
                        }
                    }
                }
            }
        },
    )
    .into_response()
}
