//! What each workflow finished in a stretch of time, and how long each item took, read from the
//! timestamps the workflows themselves record: the system's view, not the clients'. The soak's
//! windows and the chaos run's timeline both count from here.

use chrono::{DateTime, Utc};
use sqlx::MySqlPool;

/// The workflows a run loads, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Workflow {
    P2p,
    Confirmations,
    Bonuses,
    Markets,
}

impl Workflow {
    pub(crate) const ALL: [Self; 4] =
        [Self::P2p, Self::Confirmations, Self::Bonuses, Self::Markets];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::P2p => "p2p",
            Self::Confirmations => "confirmations",
            Self::Bonuses => "bonuses",
            Self::Markets => "markets",
        }
    }
}

/// Each workflow's finished items, as (finished, microseconds since the window bound passed
/// first, microseconds the item took), finished in `[from, to)`. `TIMESTAMPDIFF(MICROSECOND,
/// …)` runs on MariaDB and MySQL alike (no percentile function does).
fn finished_sql(workflow: Workflow) -> &'static str {
    match workflow {
        Workflow::P2p => {
            "SELECT TIMESTAMPDIFF(MICROSECOND, ?, closed_at), \
                    TIMESTAMPDIFF(MICROSECOND, created_at, closed_at) \
             FROM p2p_deposit_orders WHERE closed_at >= ? AND closed_at < ?"
        }
        Workflow::Confirmations => {
            "SELECT TIMESTAMPDIFF(MICROSECOND, ?, confirmed_at), \
                    TIMESTAMPDIFF(MICROSECOND, created_at, confirmed_at) \
             FROM withdrawals WHERE confirmed_at >= ? AND confirmed_at < ? \
             UNION ALL \
             SELECT TIMESTAMPDIFF(MICROSECOND, ?, confirmed_at), \
                    TIMESTAMPDIFF(MICROSECOND, created_at, confirmed_at) \
             FROM deposits WHERE confirmed_at >= ? AND confirmed_at < ?"
        }
        Workflow::Bonuses => {
            "SELECT TIMESTAMPDIFF(MICROSECOND, ?, processed_at), \
                    TIMESTAMPDIFF(MICROSECOND, created_at, processed_at) \
             FROM charge_event_job WHERE processed_at >= ? AND processed_at < ?"
        }
        Workflow::Markets => {
            "SELECT TIMESTAMPDIFF(MICROSECOND, ?, o.cancelled_at), \
                    TIMESTAMPDIFF(MICROSECOND, m.suspended_at, o.cancelled_at) \
             FROM orders o JOIN markets m ON m.id = o.market_id \
             WHERE o.cancelled_at >= ? AND o.cancelled_at < ?"
        }
    }
}

/// One finished item: when (microseconds after the bound asked from) and how long it took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finished {
    pub(crate) at_us: i64,
    pub(crate) took_us: i64,
}

pub(crate) async fn finished(
    pool: &MySqlPool,
    workflow: Workflow,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Finished>, sqlx::Error> {
    let mut query = sqlx::query_as::<_, (Option<i64>, Option<i64>)>(finished_sql(workflow));
    let parts = if workflow == Workflow::Confirmations {
        2
    } else {
        1
    };
    for _ in 0..parts {
        query = query.bind(from).bind(from).bind(to);
    }
    Ok(query
        .fetch_all(pool)
        .await?
        .into_iter()
        .filter_map(|(at_us, took_us)| {
            Some(Finished {
                at_us: at_us?,
                took_us: took_us?,
            })
        })
        .collect())
}
