//! W1's errors: what an attempt, a settlement or an order's creation can run into.

use paybus_bus::{HandlerError, outbox::OutboxError};
use paybus_ledger::LedgerError;

use crate::quote::QuoteError;

/// Why a matching attempt (or a step of it) did not complete. Outcome accounting counts every
/// one of them as a failed attempt (seed 000 §3.3: "예외 발생 → 미체결과 동일 처리").
#[derive(Debug, thiserror::Error)]
pub enum MatchError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Quote(#[from] QuoteError),
    /// A column holds a value this code does not know (a row written by something else).
    #[error(transparent)]
    UnknownValue(#[from] paybus_db::column::UnknownValue),
    /// A row disagrees with what the code that holds its lock just read: a bug or a manual
    /// edit, never a race (every write is guarded).
    #[error("inconsistent p2p rows: {0}")]
    Inconsistent(String),
}

impl MatchError {
    pub(crate) fn inconsistent(what: impl Into<String>) -> Self {
        MatchError::Inconsistent(what.into())
    }

    /// InnoDB chose this transaction as a deadlock's victim and rolled it back whole: nothing
    /// it wrote stands, so the same step may simply run again (contention, not failure).
    pub(crate) fn is_deadlock(&self) -> bool {
        let database = match self {
            MatchError::Database(e) | MatchError::Outbox(OutboxError::Database(e)) => e,
            MatchError::Ledger(LedgerError::Database(e)) => e,
            _ => return false,
        };
        paybus_db::error_number(database) == Some(DEADLOCK)
    }
}

/// MySQL's and MariaDB's "Deadlock found when trying to get lock".
const DEADLOCK: u16 = 1213;

impl From<MatchError> for HandlerError {
    fn from(error: MatchError) -> Self {
        match error {
            MatchError::Database(source)
            | MatchError::Ledger(LedgerError::Database(source))
            | MatchError::Outbox(OutboxError::Database(source)) => HandlerError::Database(source),
            MatchError::Outbox(source) => HandlerError::Outbox(source),
            other => HandlerError::rejected(other),
        }
    }
}

/// Why a deposit or withdraw order cannot be created as asked.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("partner {0} not found")]
    UnknownPartner(u64),
    #[error(transparent)]
    Match(#[from] MatchError),
}

impl From<sqlx::Error> for CreateError {
    fn from(error: sqlx::Error) -> Self {
        CreateError::Match(MatchError::Database(error))
    }
}

impl From<OutboxError> for CreateError {
    fn from(error: OutboxError) -> Self {
        CreateError::Match(MatchError::Outbox(error))
    }
}

impl CreateError {
    /// A foreign-key refusal means the partner is unknown; anything else stays a database
    /// error.
    pub(crate) fn from_insert(error: sqlx::Error, partner_id: u64) -> Self {
        if error
            .as_database_error()
            .is_some_and(|e| e.is_foreign_key_violation())
        {
            CreateError::UnknownPartner(partner_id)
        } else {
            CreateError::from(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_infrastructure_faults_are_transient() {
        assert!(HandlerError::from(MatchError::Database(sqlx::Error::PoolTimedOut)).is_transient());
        assert!(
            !HandlerError::from(MatchError::inconsistent("reserved below zero")).is_transient()
        );
        assert!(!HandlerError::from(MatchError::Quote(QuoteError::NotConfigured)).is_transient());
    }
}
