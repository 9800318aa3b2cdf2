//! The audit page: the continuous auditor's latest pass (a sweeper job,
//! `paybus_maintenance::auditor`) and what it found, read from `audit_passes` and
//! `audit_findings` — the same record as `GET /v1/admin/audit/status`. Loading the page costs
//! two indexed reads, not the checks themselves: the auditor runs them every minute over its
//! window, and the full checks over every row stay an explicit, on-demand action (`paybus
//! audit`, `GET /v1/admin/audit`).

use axum::{
    extract::State,
    response::{IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::html;
use paybus_maintenance::auditor;

use super::{Session, layout};
use crate::AppState;

/// Findings listed under the latest pass, and in the "seen before" list.
const FINDINGS_SHOWN: u32 = 100;

/// `GET /console/audit`.
pub(crate) async fn page(State(state): State<AppState>, session: Session) -> Response {
    let read = async {
        let mut conn = state.pool.acquire().await?;
        let last = auditor::recent_passes(&mut conn, 1).await?.pop();
        let current = match &last {
            Some(pass) => auditor::findings(&mut conn, Some(pass.id), FINDINGS_SHOWN).await?,
            None => Vec::new(),
        };
        let all = auditor::findings(&mut conn, None, FINDINGS_SHOWN).await?;
        Ok::<_, sqlx::Error>((last, current, all))
    };
    let (last, current, all) = match read.await {
        Ok(read) => read,
        Err(error) => return layout::failure_page(error.into()),
    };
    // A pass is late when three intervals went by without one: the sweeper is not running it.
    let interval = state.audit_interval;
    let late_after = chrono::Duration::from_std(interval * 3).unwrap_or(chrono::Duration::MAX);
    let earlier: Vec<_> = all
        .iter()
        .filter(|finding| {
            last.as_ref()
                .is_none_or(|pass| finding.last_pass_id != pass.id)
        })
        .collect();
    layout::page(
        "Audit",
        Some(&session.caller),
        html! {
            p.hint {
                "The continuous auditor checks " (state.audit.len()) " invariants of every workflow over the rows written lately, every "
                (interval.as_secs()) " s, in the sweeper. The full checks over every row: "
                code { "paybus audit" } " or " code { "GET /v1/admin/audit" } "."
            }
            @match &last {
                None => {
                    p.flash.warn #audit-status data-clean="unknown" {
                        "The auditor has not run yet: no pass is recorded (is the sweeper running?)."
                    }
                },
                Some(pass) => {
                    @if pass.violations == 0 {
                        p.flash #audit-status data-clean="true" { "Audit clean: the latest pass found no violation." }
                    } @else {
                        p.flash.error #audit-status data-clean="false" {
                            "The latest pass found " (pass.violations) " violation(s)."
                        }
                    }
                    p #last-pass data-pass-id=(pass.id) {
                        "Pass " (pass.id) " at " (at(pass.started_at)) ": "
                        (pass.checks) " checks over the rows written since "
                        (pass.window_since.map_or_else(|| "the start".to_owned(), at))
                        ", " (pass.duration_ms) " ms."
                    }
                    @if Utc::now() - pass.finished_at > late_after {
                        p.flash.warn #audit-late {
                            "This pass is older than three intervals: the auditor has stopped passing (is the sweeper running?)."
                        }
                    }
                },
            }
            @if !current.is_empty() {
                h2 { "Found by the latest pass" }
                (findings_table("Found by the latest pass", &current.iter().collect::<Vec<_>>()))
            }
            @if !earlier.is_empty() {
                h2 { "Found by earlier passes, not by the latest" }
                (findings_table("Found by earlier passes", &earlier))
            }
        },
    )
    .into_response()
}

/// The findings in a table named `name`.
fn findings_table(name: &str, findings: &[&auditor::Finding]) -> maud::Markup {
    html! {
        (layout::wide_table(name, html! {
            table.findings {
                thead { tr { th { "Check" } th { "What" } th { "First seen" } th { "Last seen" } th.n { "Times" } } }
                tbody {
                    @for finding in findings {
                        tr.finding data-check=(finding.check_name) {
                            td { code { (finding.check_name) } }
                            td { (finding.description) }
                            td { (at(finding.first_seen_at)) }
                            td { (at(finding.last_seen_at)) }
                            td.n { (finding.times_seen) }
                        }
                    }
                }
            }
        }))
    }
}

fn at(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
