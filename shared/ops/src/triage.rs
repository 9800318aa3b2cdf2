//! Dead-letter triage: what a function says about one of its dead letters before anyone
//! replays it (`paybus dead-letters`, the admin API).
//!
//! A replay is only safe when the side effect it would cause has not happened since and the
//! function would accept the message now. Nothing else knows that but the function: each
//! function crate reads the row its message refers to and returns a [`Triage`]: the
//! [`Verdict`], a reason, the referenced rows as they stand, and the money at stake. A
//! function without a triage of its own classifies every dead letter as
//! [`Verdict::NeedsHuman`] (the default of `Function::triage`): nothing is replayed blind.

use std::{future::Future, pin::Pin};

use paybus_money::Amount;
use serde::Serialize;
use sqlx::MySqlConnection;

paybus_db::column_enum! {
    case = "snake_case";
    /// What a replay of a dead letter would do.
    #[derive(Hash, PartialOrd, Ord)]
    pub enum Verdict {
        /// The side effect exists already (the referenced row is terminal, or the ledger key is
        /// there): a replay would at best be skipped. Never sent.
        AlreadyApplied,
        /// The referenced row is in the state the function acts on: a replay applies it once.
        Safe,
        /// The row does not exist, or is in a state the function would refuse: ops decide.
        NeedsHuman,
    }
}

/// A row a dead letter refers to, as it stands now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Referenced {
    /// What the row is (`withdrawal`, `deposit`, `partner_notification`, ...).
    pub entity: &'static str,
    pub id: u64,
    /// Its current state (status column), `None` when the row does not exist.
    pub state: Option<String>,
    /// The row itself (`null` when it does not exist).
    pub row: serde_json::Value,
}

/// Money a dead letter holds up: what its message would move when applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exposure {
    /// The row whose money it is (`withdrawal` 42): several letters about one row hold its
    /// money up once.
    pub entity: &'static str,
    pub id: u64,
    /// The partner whose balance it concerns (`None`: a member's bonus, not a partner's).
    pub partner_id: Option<u64>,
    pub currency: String,
    pub amount: Amount,
}

/// A function's judgement of one dead letter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Triage {
    pub verdict: Verdict,
    /// One line for ops: why this verdict, naming the row and its state.
    pub reason: String,
    pub referenced: Vec<Referenced>,
    pub exposure: Option<Exposure>,
}

impl Triage {
    pub fn already_applied(reason: impl Into<String>) -> Self {
        Self::new(Verdict::AlreadyApplied, reason)
    }

    pub fn safe(reason: impl Into<String>) -> Self {
        Self::new(Verdict::Safe, reason)
    }

    pub fn needs_human(reason: impl Into<String>) -> Self {
        Self::new(Verdict::NeedsHuman, reason)
    }

    fn new(verdict: Verdict, reason: impl Into<String>) -> Self {
        Self {
            verdict,
            reason: reason.into(),
            referenced: Vec::new(),
            exposure: None,
        }
    }

    /// Names a row the message refers to (`row`: its serialised form, or `None` if absent).
    pub fn referring_to<R: Serialize>(
        mut self,
        entity: &'static str,
        id: u64,
        state: Option<String>,
        row: Option<&R>,
    ) -> Self {
        let row = row
            .and_then(|row| serde_json::to_value(row).ok())
            .unwrap_or(serde_json::Value::Null);
        self.referenced.push(Referenced {
            entity,
            id,
            state,
            row,
        });
        self
    }

    pub fn exposing(mut self, exposure: Exposure) -> Self {
        self.exposure = Some(exposure);
        self
    }
}

pub type TriageError = Box<dyn std::error::Error + Send + Sync>;
pub type TriageFuture<'c> = Pin<Box<dyn Future<Output = Result<Triage, TriageError>> + Send + 'c>>;
/// A function's triage over a dead letter's raw body (what `FunctionEntry` carries).
pub type TriageFn = for<'c> fn(&'c mut MySqlConnection, &'c [u8]) -> TriageFuture<'c>;
pub type PrepareReplayFuture<'c> =
    Pin<Box<dyn Future<Output = Result<(), TriageError>> + Send + 'c>>;
/// A function's preparation of a replay over a dead letter's raw body.
pub type PrepareReplayFn = for<'c> fn(&'c mut MySqlConnection, &'c [u8]) -> PrepareReplayFuture<'c>;
