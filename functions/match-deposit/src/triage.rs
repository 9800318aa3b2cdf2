//! What a replay of a dead-lettered `p2p.deposit_order.created` would do (`paybus dead-letters`):
//! it depends on the order's state now, exactly as the handler's claim decides (seed 000 §3.3).
//! The exposure is what the order still waits for: its `remaining_amount`, for its partner.
//!
//! | the deposit order now | verdict |
//! | --- | --- |
//! | MATCHED, CANCELLED or EXPIRED (terminal: the usual dead letter is the CANCELLED MATCH_FAILED one) | already applied: a replay would be skipped |
//! | PENDING and due (`next_attempt_at` unset or past) | safe: a replay claims it and makes one matching attempt, under the same claim and accounting as any message |
//! | PENDING in its backoff | needs a human: a replay would be skipped; the due-orders job claims it when due |
//! | MATCHING | needs a human: an attempt holds it (the zombie reaper hands a dead claim back) |
//! | IN_DOUBT | needs a human: a trade may exist at the quote service under the fill's key (named); look there, then `paybus p2p recheck` |
//! | PENDING with a fill in doubt | needs a human: asking about it is under way (a replay would only ask sooner) |
//! | absent | needs a human |

use chrono::{DateTime, Utc};
use paybus_money::Amount;
use paybus_ops::triage::{Exposure, Triage, TriageError};
use paybus_p2p::{DepositOrderCreated, DepositOrderStatus, deposit_order};
use sqlx::MySqlConnection;

const ENTITY: &str = "p2p_deposit_order";

pub(crate) async fn triage(
    conn: &mut MySqlConnection,
    message: DepositOrderCreated,
) -> Result<Triage, TriageError> {
    let id = message.deposit_order_id;
    let Some(order) = deposit_order::find(conn, id).await? else {
        return Ok(
            Triage::needs_human(format!("deposit order {id} does not exist"))
                .referring_to::<()>(ENTITY, id, None, None),
        );
    };
    // The database's clock, the one the claim compares `next_attempt_at` with.
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT NOW(6)")
        .fetch_one(&mut *conn)
        .await?;
    let status = order.status;
    let in_doubt: Option<(String, Amount, u32)> = sqlx::query_as(
        "SELECT trade_key, SUM(amount), MAX(trade_checks) FROM p2p_matches \
         WHERE deposit_order_id = ? AND status = 'TRADING' GROUP BY trade_key LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let triage = match (status, in_doubt) {
        (DepositOrderStatus::InDoubt, Some((key, amount, checks))) => Triage::needs_human(format!(
            "deposit order {id} is IN_DOUBT: createTrade's outcome stayed unknown after {checks} \
             call(s), so a trade may exist at the quote service under key {key} for {} {}. \
             Look it up there (`paybus reconcile quotes` lists it), then `paybus p2p recheck \
             {id}` asks once more under the same key: the trade is settled if it exists, the \
             liquidity released if the service says it does not",
            amount, order.currency
        )),
        (_, Some((key, _, checks))) => Triage::needs_human(format!(
            "deposit order {id} is {status} with a fill in doubt under key {key} ({checks} \
             unknown outcome(s) so far): asking the quote service again is under way"
        )),
        (status, None) => match status {
            _ if status.is_terminal() => Triage::already_applied(format!(
                "deposit order {id} is {status}{}: closed, a replay would be skipped",
                order
                    .close_reason
                    .map(|reason| format!(" ({reason})"))
                    .unwrap_or_default()
            )),
            DepositOrderStatus::Pending => match order.next_attempt_at {
                Some(due) if due > now => Triage::needs_human(format!(
                    "deposit order {id} is PENDING in its backoff until {} (after {} failed \
                 attempt(s)): a replay would be skipped; the due-orders job claims it then",
                    due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    order.match_attempt_count
                )),
                _ if order.expires_at <= now => Triage::safe(format!(
                    "deposit order {id} is PENDING and due but past its expiry: a replay claims it \
                 and closes it EXPIRED once"
                )),
                _ => Triage::safe(format!(
                    "deposit order {id} is PENDING and due: a replay claims it and makes one \
                 matching attempt for {} {}",
                    order.remaining_amount, order.currency
                )),
            },
            DepositOrderStatus::InDoubt => Triage::needs_human(format!(
                "deposit order {id} is IN_DOUBT but none of its fills is TRADING: {}",
                order.last_error.as_deref().unwrap_or("no error recorded")
            )),
            _ => Triage::needs_human(format!(
                "deposit order {id} is MATCHING: an attempt holds it (claimed at {}; the zombie \
             reaper hands a dead claim back)",
                order.claimed_at.map_or_else(
                    || "an unknown time".to_owned(),
                    |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )
            )),
        },
    };
    Ok(triage
        .exposing(Exposure {
            entity: ENTITY,
            id,
            partner_id: Some(order.partner_id),
            currency: order.currency.clone(),
            amount: order.remaining_amount,
        })
        .referring_to(ENTITY, id, Some(status.to_string()), Some(&order)))
}
