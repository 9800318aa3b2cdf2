//! The result of a conditional transition (principle 1) and what it means to a handler.
//!
//! Every workflow step is one `UPDATE ... WHERE id = ? AND status IN (...)`: 1 row is "I made
//! the transition" (commit it with its side effects), 0 rows is "someone else did, or it is
//! not allowed" (write nothing), and no row at all is a message about nothing.

use std::fmt::Display;

use crate::{HandlerError, Outcome, UnitOfWork};

/// What a conditional transition decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition<T, S> {
    /// This call made the transition and wrote its side effects (`T`); commit them.
    Transitioned(T),
    /// The conditional UPDATE matched no row; `current` is the row's latest committed state.
    /// Nothing was written.
    NotTransitioned { current: S },
    /// No row has this id.
    NotFound,
}

impl<T, S> Transition<T, S> {
    /// Commits `uow` when the transition happened, rolls it back otherwise, and rolls it back
    /// after an error too, so no lock outlives the attempt (the error that matters is the
    /// first one).
    pub async fn commit_or_rollback<E: Into<HandlerError>>(
        uow: UnitOfWork<'_>,
        result: Result<Self, E>,
    ) -> Result<Self, HandlerError> {
        match result {
            Ok(transition @ Transition::Transitioned(_)) => {
                uow.commit().await?;
                Ok(transition)
            }
            Ok(other) => {
                uow.rollback().await?;
                Ok(other)
            }
            Err(error) => {
                if let Err(rollback) = uow.rollback().await {
                    tracing::warn!(%rollback, "rolling back a failed transition failed");
                }
                Err(error.into())
            }
        }
    }
}

impl<T, S> Transition<T, S> {
    /// The handler's outcome: `Done` for the transition, `Failed` (a dead letter) when
    /// `subject` (e.g. "withdrawal 7") does not exist, and what `not_transitioned` makes of
    /// the row's current state otherwise: `Skipped` for a plain duplicate, `Failed` for an
    /// anomaly ops must see (principle 9).
    pub fn outcome(
        &self,
        subject: impl Display,
        not_transitioned: impl FnOnce(&S) -> Outcome,
    ) -> Outcome {
        match self {
            Transition::Transitioned(_) => Outcome::Done,
            Transition::NotTransitioned { current } => not_transitioned(current),
            Transition::NotFound => Outcome::Failed(format!("{subject} does not exist")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(current: &&str) -> Outcome {
        if *current == "CONFIRMED" {
            Outcome::Skipped(format!("withdrawal 7 is already {current}"))
        } else {
            Outcome::Failed(format!("withdrawal 7 is {current}, not in flight"))
        }
    }

    #[test]
    fn each_decision_has_its_outcome() {
        let done: Transition<(), &str> = Transition::Transitioned(());
        assert_eq!(done.outcome("withdrawal 7", decide), Outcome::Done);
        let duplicate: Transition<(), &str> = Transition::NotTransitioned {
            current: "CONFIRMED",
        };
        assert_eq!(
            duplicate.outcome("withdrawal 7", decide),
            Outcome::Skipped("withdrawal 7 is already CONFIRMED".to_owned())
        );
        let refused: Transition<(), &str> = Transition::NotTransitioned { current: "FAILED" };
        assert_eq!(
            refused.outcome("withdrawal 7", decide),
            Outcome::Failed("withdrawal 7 is FAILED, not in flight".to_owned())
        );
        let missing: Transition<(), &str> = Transition::NotFound;
        assert_eq!(
            missing.outcome("withdrawal 7", decide),
            Outcome::Failed("withdrawal 7 does not exist".to_owned())
        );
    }
}
