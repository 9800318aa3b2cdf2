use paybus_platform::{function::FunctionEntry, triage::Triage};
use sqlx::MySqlConnection;

use crate::{DeadLetterError, letter::DeadLetter};

/// Finds a dead letter's function in the catalog and asks it for its [`Triage`]. A letter of
/// no listed function (`unrouted`, a function since removed) needs a human.
#[derive(Debug, Clone, Copy)]
pub struct Triager {
    functions: &'static [FunctionEntry],
}

impl Triager {
    /// Over the catalog's functions (`paybus_catalog::FUNCTIONS`).
    pub const fn new(functions: &'static [FunctionEntry]) -> Self {
        Self { functions }
    }

    /// Prepares the replay of a letter found *safe* (its function's `prepare_replay`), in
    /// the replay's transaction.
    pub async fn prepare_replay(
        &self,
        conn: &mut MySqlConnection,
        letter: &DeadLetter,
        body: &[u8],
    ) -> Result<(), DeadLetterError> {
        let Some(function) = self.function(letter) else {
            return Ok(());
        };
        function
            .prepare_replay(conn, body)
            .await
            .map_err(|source| DeadLetterError::Triage {
                id: letter.id,
                source,
            })
    }

    fn function(&self, letter: &DeadLetter) -> Option<&'static FunctionEntry> {
        self.functions
            .iter()
            .find(|f| f.name == letter.function_name)
    }

    pub async fn triage(
        &self,
        conn: &mut MySqlConnection,
        letter: &DeadLetter,
        body: &[u8],
    ) -> Result<Triage, DeadLetterError> {
        let Some(function) = self.function(letter) else {
            return Ok(Triage::needs_human(format!(
                "no function named {:?} in the catalog (routing key {:?}): nothing knows how \
                 to apply it",
                letter.function_name, letter.routing_key
            )));
        };
        function
            .triage(conn, body)
            .await
            .map_err(|source| DeadLetterError::Triage {
                id: letter.id,
                source,
            })
    }
}
