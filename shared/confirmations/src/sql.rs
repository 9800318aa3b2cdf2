//! The statement forms the repositories ([`crate::withdrawal`], [`crate::deposit`]) share: a
//! row by its key, and rows named by a list of ids — one statement with one bound list,
//! whatever the number. A database error names the entity the statement was about.

use sqlx::{FromRow, MySql, MySqlConnection, QueryBuilder, mysql::MySqlRow};

use crate::ConfirmError;

/// The row `sql` selects with `keys` bound in order, or `None`.
pub(crate) async fn one<R>(
    conn: &mut MySqlConnection,
    sql: &'static str,
    keys: &[u64],
    entity: &'static str,
) -> Result<Option<R>, ConfirmError>
where
    R: for<'r> FromRow<'r, MySqlRow> + Send + Unpin,
{
    keys.iter()
        .fold(sqlx::query_as(sql), |query, key| query.bind(*key))
        .fetch_optional(conn)
        .await
        .map_err(ConfirmError::database(entity))
}

/// The rows `head` (ending `... IN `) selects with `ids` as its list and `tail` after it; none,
/// without a statement, when `ids` is empty.
pub(crate) async fn of_ids<R>(
    conn: &mut MySqlConnection,
    head: &'static str,
    ids: &[u64],
    tail: &str,
    entity: &'static str,
) -> Result<Vec<R>, ConfirmError>
where
    R: for<'r> FromRow<'r, MySqlRow> + Send + Unpin,
{
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = QueryBuilder::<MySql>::new(head);
    push_list(&mut query, ids.iter().copied());
    query.push(tail);
    query
        .build_query_as()
        .fetch_all(conn)
        .await
        .map_err(ConfirmError::database(entity))
}

/// Runs `update` (ending `... IN `) with `ids` as its list: the number of rows it moved.
pub(crate) async fn update_ids(
    conn: &mut MySqlConnection,
    mut update: QueryBuilder<MySql>,
    ids: impl IntoIterator<Item = u64>,
    entity: &'static str,
) -> Result<u64, ConfirmError> {
    push_list(&mut update, ids);
    Ok(update
        .build()
        .execute(conn)
        .await
        .map_err(ConfirmError::database(entity))?
        .rows_affected())
}

/// `(?, ?, ...)`, one bound value per id.
fn push_list(query: &mut QueryBuilder<MySql>, ids: impl IntoIterator<Item = u64>) {
    query.push("(");
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(id);
    }
    query.push(")");
}
