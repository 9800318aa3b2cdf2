//! The errors of W3's repository code. Which of them a retry can fix is decided once, by the
//! platform (`HandlerError::is_transient`), after [`From<BonusError> for HandlerError`].

use paybus_bus::{HandlerError, outbox::OutboxError};
use paybus_db::column::UnknownValue;

#[derive(Debug, thiserror::Error)]
pub enum BonusError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    #[error(transparent)]
    UnknownValue(#[from] UnknownValue),
    /// A row this code just wrote or locked is not there (only a concurrent DELETE, which no
    /// paybus code issues, could get here).
    #[error("{entity} {id} vanished inside the transaction that holds it")]
    Vanished { entity: &'static str, id: u64 },
    /// What the database answered contradicts itself (a bug, not a client's mistake).
    #[error("inconsistent state: {0}")]
    Inconsistent(String),
}

impl From<BonusError> for HandlerError {
    fn from(error: BonusError) -> Self {
        match error {
            BonusError::Database(source) | BonusError::Outbox(OutboxError::Database(source)) => {
                HandlerError::Database(source)
            }
            BonusError::Outbox(source) => HandlerError::Outbox(source),
            other => HandlerError::rejected(other),
        }
    }
}

pub(crate) use paybus_db::column::parse as parse_column;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_infrastructure_faults_are_retried() {
        assert!(HandlerError::from(BonusError::Database(sqlx::Error::PoolTimedOut)).is_transient());
        assert!(
            !HandlerError::from(BonusError::UnknownValue(UnknownValue {
                entity: "bonus job",
                id: 1,
                column: "status",
                value: "LOST".into()
            }))
            .is_transient()
        );
    }
}
