//! What the docs checks read: markdown pages as GitHub renders them ([`page`]), the
//! repository's files ([`tree`]) and a crate's module graph ([`modules`]). The checks
//! themselves are this crate's tests.

pub mod modules;
pub mod page;
pub mod tree;
