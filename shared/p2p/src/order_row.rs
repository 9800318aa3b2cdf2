//! Reading one order, for deposit and withdraw orders alike: the statement the order's module
//! writes, its row made into the order.

use sqlx::{AssertSqlSafe, FromRow, MySqlConnection, mysql::MySqlRow};

use crate::MatchError;

/// The row `select` reads with `keys` bound in order, made into its order by `into_order`;
/// `None` without a row.
pub(crate) async fn select_one<R, T>(
    conn: &mut MySqlConnection,
    select: String,
    keys: &[u64],
    into_order: fn(R) -> Result<T, MatchError>,
) -> Result<Option<T>, MatchError>
where
    R: for<'r> FromRow<'r, MySqlRow> + Send + Unpin,
{
    let row: Option<R> = keys
        .iter()
        .fold(sqlx::query_as(AssertSqlSafe(select)), |query, key| {
            query.bind(*key)
        })
        .fetch_optional(conn)
        .await?;
    row.map(into_order).transpose()
}
