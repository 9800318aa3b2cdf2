use futures_util::{StreamExt, TryStreamExt, stream};
use paybus_platform::{function::FunctionEntry, triage::Triage};
use sqlx::{MySqlConnection, MySqlPool};

use crate::{DeadLetterError, letter::DeadLetter};

/// Letters triaged at once by [`Triager::triage_each`], each on a pooled connection of its
/// own. A triage is one or two point reads, so a scan of hundreds is round trips end to end;
/// where the database is across a network (RDS) a few at once hide the latency, without
/// taking the pool from the API's other requests. (On one 2-core machine with the database
/// beside it, `bench ops-queries` showed no gain: there the reads are CPU, not waiting.)
pub const TRIAGE_CONNECTIONS: usize = 4;

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

    /// [`Triager::triage`] of each letter, [`TRIAGE_CONNECTIONS`] at a time, answered in the
    /// letters' order. Each triage reads the rows as they stand when it runs, as one by one
    /// on a connection did (no triage ever ran in a snapshot of the others).
    pub async fn triage_each(
        &self,
        pool: &MySqlPool,
        letters: Vec<(DeadLetter, Vec<u8>)>,
    ) -> Result<Vec<(DeadLetter, Triage)>, DeadLetterError> {
        stream::iter(letters)
            .map(|(letter, body)| async move {
                let mut conn = pool.acquire().await?;
                let triage = self.triage(&mut conn, &letter, &body).await?;
                Ok::<_, DeadLetterError>((letter, triage))
            })
            .buffered(TRIAGE_CONNECTIONS)
            .try_collect()
            .await
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
