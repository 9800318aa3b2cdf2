use paybus_bus::outbox::OutboxError;
use paybus_ops::triage::TriageError;

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
    /// Nothing to freeze into an operation: no letter of the selection is NEW.
    #[error("no letter of the selection is NEW: nothing to act on")]
    NothingSelected,
    #[error("operation {0} does not exist")]
    OperationNotFound(uuid::Uuid),
    /// Four-eyes: the requester cannot approve their own operation.
    #[error("operation {0} was requested by you: another ADMIN must approve it")]
    SelfApproval(uuid::Uuid),
    /// Four-eyes needs two people the identity provider vouches for: a break-glass token's
    /// holder (or an operation requested without an identity) cannot be one of them.
    #[error("{0}")]
    NotAPerson(String),
    /// The operation cannot do what was asked in the state it is in (awaiting approval,
    /// expired, done, a hash that is not its own).
    #[error("operation {id}: {problem}")]
    OperationState { id: uuid::Uuid, problem: String },
    /// Its stored letters no longer hash to what was approved: refused, and worth a look.
    #[error("operation {0}: its letters no longer match its hash (changed after the dry run)")]
    OperationTampered(uuid::Uuid),
    /// A selection ops got wrong (no ids, a stored body that is not an envelope).
    #[error("{0}")]
    Invalid(String),
}
