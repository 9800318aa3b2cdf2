//! Dead letters for ops (docs/operations.md): what `paybus dead-letters` and the admin API's
//! `/v1/admin/dead-letters` do, on the `dead_letters` table the platform's recorders fill.
//!
//! - [`letter`]: a dead letter as stored, the list, one letter with its headers, body and the
//!   rows it refers to ([`letter::show`]), and [`Selection`] (ids, or a function + reason group).
//! - [`groups`]: the letters grouped by function and reason (count, first and last seen) with
//!   the money at stake summed per partner and currency, biggest first.
//! - [`Triager`]: asks the letter's function (the catalog's `FunctionEntry::triage`) what a
//!   replay would do: *already applied*, *safe to replay*, *needs a human*.
//! - [`replay`]: the dry run (every selected letter classified, nothing written), and one
//!   letter's replay (only when safe, re-checked under the letter's lock, sent through the
//!   outbox) or archive.
//! - [`operation`]: a dry run frozen into an operation (its letters with their verdicts, a
//!   hash, an expiry), approved by a second person when four-eyes says so, and
//!   executed once, letter by letter at a bounded rate, resumable.
//! - [`trail`]: every action on a letter (`dead_letter_actions`), written with the action.
//!
//! No replay ever relies on the dry run it follows: the verdict is taken again in the
//! transaction that sends the message, and the function's own guards stand behind that.

mod error;
pub mod groups;
pub mod letter;
pub mod operation;
pub mod replay;
pub mod trail;
mod triager;

pub use error::DeadLetterError;
pub use groups::{ExposureSum, Group, Overview};
pub use letter::{DeadLetter, DeadLetterDetail, LetterStatus, ListFilter, Selection};
pub use operation::{
    ExecuteOptions, ExecutionReport, Operation, OperationAction, OperationDetail, OperationStatus,
};
pub use replay::{Classified, DryRun, ReplayResult};
pub use trail::{Action, ActionKind, ActionResult};
pub use triager::Triager;
