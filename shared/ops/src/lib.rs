//! Who acts and what they did, as rows: [`actor`] (a person or a service, and how they signed
//! in), [`audit`] (the checks of what must always hold, and the [`audit_check!`] that declares
//! one), [`ops_log`] (the hash-chained log of every operator action), [`approvals`] (four-eyes
//! operations bound to what was previewed) and [`triage`] (what a dead letter holds up).
//! Below the bus: the bus records its pauses in the ops log.

pub mod actor;
pub mod approvals;
pub mod audit;
pub mod ops_log;
pub mod triage;
