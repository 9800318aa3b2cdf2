//! The one error of W2's confirmations, shared by confirm-withdrawal and confirm-deposit.
//! Which of its variants a retry can fix is decided once, by the platform
//! (`HandlerError::is_transient`), after [`From<ConfirmError> for HandlerError`].

use paybus_bus::{HandlerError, outbox::OutboxError};
use paybus_ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    #[error("database error while confirming a {entity}: {source}")]
    Database {
        entity: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("enqueueing the {entity} notification: {source}")]
    Notification {
        entity: &'static str,
        #[source]
        source: OutboxError,
    },
    #[error("tx hash {tx_hash:?} is not valid: {reason}")]
    InvalidTxHash {
        tx_hash: String,
        reason: &'static str,
    },
    /// A batch's conditional UPDATE moved fewer rows than it had locked in flight: nothing of
    /// the batch is kept (the caller rolls back and goes one by one).
    #[error("{moved} of {expected} locked {entity} rows moved by the batch's update")]
    Incomplete {
        entity: &'static str,
        expected: u64,
        moved: u64,
    },
    #[error("{entity} {id} has {column} {value:?}, which this code does not know")]
    UnknownValue {
        entity: &'static str,
        id: u64,
        column: &'static str,
        value: String,
    },
}

impl ConfirmError {
    pub(crate) fn database(entity: &'static str) -> impl Fn(sqlx::Error) -> Self {
        move |source| ConfirmError::Database { entity, source }
    }
}

impl From<ConfirmError> for HandlerError {
    fn from(error: ConfirmError) -> Self {
        match error {
            ConfirmError::Database { source, .. }
            | ConfirmError::Ledger(LedgerError::Database(source)) => HandlerError::Database(source),
            ConfirmError::Notification {
                source: OutboxError::Database(source),
                ..
            } => HandlerError::Database(source),
            ConfirmError::Notification { source, .. } => HandlerError::Outbox(source),
            other => HandlerError::rejected(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient(error: ConfirmError) -> bool {
        HandlerError::from(error).is_transient()
    }

    #[test]
    fn only_infrastructure_faults_are_retried() {
        assert!(transient(ConfirmError::Database {
            entity: "withdrawal",
            source: sqlx::Error::PoolTimedOut
        }));
        assert!(transient(ConfirmError::Ledger(LedgerError::Database(
            sqlx::Error::PoolTimedOut
        ))));
        assert!(!transient(ConfirmError::Ledger(
            LedgerError::InvalidCurrency {
                currency: "usdt".into()
            }
        )));
        assert!(!transient(ConfirmError::UnknownValue {
            entity: "deposit",
            id: 1,
            column: "status",
            value: "LOST".into()
        }));
        assert!(!transient(ConfirmError::InvalidTxHash {
            tx_hash: String::new(),
            reason: "it is empty"
        }));
    }
}

/// Why a withdrawal or deposit cannot be created as asked.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("partner {0} not found")]
    UnknownPartner(u64),
    #[error(
        "status must be REQUESTED, PROCESSING, BROADCASTING or STALE at creation: CONFIRMED and \
         FAILED are reached only through the workflow"
    )]
    NotInitial,
    #[error("an active deposit with this tx_hash and to_address already exists{}", existing.map_or_else(String::new, |id| format!(" (deposit {id})")))]
    DuplicateActive { existing: Option<u64> },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
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
            CreateError::Database(error)
        }
    }
}
