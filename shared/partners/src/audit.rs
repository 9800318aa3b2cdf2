//! The partners' invariant:
//!
//! | check | invariant |
//! | --- | --- |
//! | `partner_secrets_sealed` | no partner keeps a plaintext `webhook_secret` (the migration's sealing step empties the column; a value there is a secret readable in any dump) |
//!
//! The partners table is small (one row per company we work for), so the check reads it
//! whole every pass.

use std::fmt;

use paybus_ops::audit::{Check, Finding};
use serde::Serialize;
use sqlx::MySqlConnection;

/// The partners' checks.
pub const CHECKS: &[Check] = &[paybus_ops::audit_check!(
    "partner_secrets_sealed",
    plaintext_secrets,
    bounded
)];

/// A partner whose webhook secret is stored in plaintext.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct PlaintextSecret {
    pub partner_id: u64,
}

impl Finding for PlaintextSecret {
    fn check(&self) -> &'static str {
        "partner_secrets_sealed"
    }
}

impl fmt::Display for PlaintextSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "partner_secrets_sealed: partner {} keeps a plaintext webhook_secret (run `paybus \
             migrate` with PAYBUS_SECRETS_KEY set)",
            self.partner_id
        )
    }
}

pub async fn plaintext_secrets(
    conn: &mut MySqlConnection,
) -> Result<Vec<PlaintextSecret>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id AS partner_id FROM partners WHERE webhook_secret IS NOT NULL ORDER BY id",
    )
    .fetch_all(conn)
    .await
}
