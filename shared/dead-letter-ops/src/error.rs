use paybus_platform::{bus::outbox::OutboxError, triage::TriageError};

/// What a dead-letter operation could not do.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    /// The function's triage failed (e.g. the database went away mid-read).
    #[error("triage of dead letter {id}: {source}")]
    Triage {
        id: u64,
        #[source]
        source: TriageError,
    },
    #[error("dead letter {0} does not exist")]
    NotFound(u64),
    /// A selection ops got wrong (no ids, a stored body that is not an envelope).
    #[error("{0}")]
    Invalid(String),
}
