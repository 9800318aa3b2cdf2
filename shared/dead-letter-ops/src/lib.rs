//! Dead letters for ops (docs/operations.md): what `paybus dead-letters` and the admin API's
//! `/v1/admin/dead-letters` do, on the `dead_letters` table the platform's recorders fill.
//!
//! - [`letter`]: a letter as stored, the list, [`Selection`] (ids, or a function + reason
//!   group); [`detail`]: one letter in full, with what a replay would do now.
//! - [`groups`]: the letters by function and reason, with the money at stake per partner.
//! - [`Triager`]: asks the letter's function what a replay would do (*already applied*, *safe
//!   to replay*, *needs a human*).
//! - [`replay`]: the dry run, and one letter's replay (only when safe, re-checked under the
//!   letter's lock, sent through the outbox) or archive.
//! - [`operation`]: a dry run frozen into an operation, approved under four-eyes, executed once;
//!   [`trail`]: every action on a letter, written with the action.
//!
//! The rule: no replay relies on the dry run it follows; the verdict is taken again in the
//! transaction that sends the message, and the function's own guards stand behind that.

pub mod detail;
mod error;
pub mod groups;
pub mod letter;
pub mod operation;
pub mod replay;
pub mod trail;
mod triager;

pub use detail::DeadLetterDetail;
pub use error::DeadLetterError;
pub use groups::{ExposureSum, Group, Overview};
pub use letter::{DeadLetter, LetterStatus, ListFilter, Selection};
pub use operation::{
    ExecuteOptions, ExecutionReport, Operation, OperationAction, OperationDetail, OperationStatus,
};
pub use replay::{Classified, DryRun, ReplayResult};
pub use trail::{Action, ActionKind, ActionResult};
pub use triager::Triager;
