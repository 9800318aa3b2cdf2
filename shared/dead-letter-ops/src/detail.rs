//! One letter in full, as ops read it before deciding: the letter, its headers and body, what
//! a replay would do now ([`Triager`]) and what was done to it so far ([`trail`]).

use paybus_ops::triage::Triage;
use serde::Serialize;
use sqlx::MySqlConnection;

use crate::{
    DeadLetterError, Triager,
    letter::{self, DeadLetter},
    trail::{self, Action},
};

/// One letter in full: what ops need to decide about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterDetail {
    #[serde(flatten)]
    pub letter: DeadLetter,
    /// The AMQP headers as recorded (`x-paybus-*`, `x-death`, ...).
    pub headers: serde_json::Value,
    /// The body: its JSON when it is JSON, else its text (invalid UTF-8 replaced).
    pub body: serde_json::Value,
    /// What a replay would do now, with the rows the message refers to as they stand.
    pub triage: Triage,
    /// What ops did to it so far, oldest first.
    pub actions: Vec<Action>,
}

/// [`DeadLetterDetail`] of letter `id`, or `None`.
pub async fn show(
    conn: &mut MySqlConnection,
    triager: &Triager,
    id: u64,
) -> Result<Option<DeadLetterDetail>, DeadLetterError> {
    let Some((letter, body)) = letter::find(conn, id).await? else {
        return Ok(None);
    };
    let headers: Option<String> =
        sqlx::query_scalar("SELECT headers FROM dead_letters WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *conn)
            .await?;
    let headers = headers
        .filter(|text| !text.is_empty())
        .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
        .unwrap_or(serde_json::Value::Null);
    let triage = triager.triage(conn, &letter, &body).await?;
    let actions = trail::of_letter(conn, id).await?;
    Ok(Some(DeadLetterDetail {
        body: body_view(&body),
        letter,
        headers,
        triage,
        actions,
    }))
}

fn body_view(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(body).into_owned()))
}
