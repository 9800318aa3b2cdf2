//! Running a function: the [`Function`](function::Function) trait and the one entry point that
//! runs it as a local consumer or a Lambda ([`function`]), the Lambda adapter ([`lambda`]), the
//! all-in-one process's runner ([`runner`]) and bringing a database up to this release
//! ([`migrations`]). The top of the platform: it stands on every other platform crate.

pub mod function;
pub mod lambda;
pub mod migrations;
pub mod runner;
