use futures_util::future;
use paybus_ops::triage::Triage;
use paybus_runtime::function::FunctionEntry;
use sqlx::{MySqlConnection, MySqlPool};

use crate::{DeadLetterError, letter::DeadLetter};

/// Connections [`Triager::triage_each`] triages on at once. A triage is one or two point
/// reads, so a scan of hundreds is round trips end to end; where the database is across a
/// network (RDS) a few at once hide the latency, without taking the pool from the API's other
/// requests. (On one 2-core machine with the database beside it, `bench ops-queries` shows no
/// gain: there the reads are CPU, not waiting.)
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

    /// [`Triager::triage`] of each letter, on [`TRIAGE_CONNECTIONS`] connections at once,
    /// answered in the letters' order. Each connection is acquired once and triages every
    /// n-th letter: an acquire per letter also cost the pool's ping of the connection, a
    /// third of the scan's round trips. Each triage reads the rows as they stand when it
    /// runs, as one by one on a connection did (no triage ever ran in a snapshot of the
    /// others).
    pub async fn triage_each(
        &self,
        pool: &MySqlPool,
        letters: Vec<(DeadLetter, Vec<u8>)>,
    ) -> Result<Vec<(DeadLetter, Triage)>, DeadLetterError> {
        let lanes = TRIAGE_CONNECTIONS.min(letters.len());
        let mut shares: Vec<Vec<(usize, DeadLetter, Vec<u8>)>> =
            (0..lanes).map(|_| Vec::new()).collect();
        for (n, (letter, body)) in letters.into_iter().enumerate() {
            shares[n % lanes].push((n, letter, body));
        }
        let triaged = future::try_join_all(shares.into_iter().map(|share| async move {
            let mut conn = pool.acquire().await?;
            let mut triaged = Vec::with_capacity(share.len());
            for (n, letter, body) in share {
                let triage = self.triage(&mut conn, &letter, &body).await?;
                triaged.push((n, letter, triage));
            }
            Ok::<_, DeadLetterError>(triaged)
        }))
        .await?;
        let mut triaged: Vec<_> = triaged.into_iter().flatten().collect();
        triaged.sort_unstable_by_key(|(n, _, _)| *n);
        Ok(triaged
            .into_iter()
            .map(|(_, letter, triage)| (letter, triage))
            .collect())
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
