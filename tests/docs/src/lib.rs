//! What the docs checks read: markdown pages as GitHub renders them ([`page`]), the
//! repository's files ([`tree`]), a crate's module graph ([`modules`]) and CHANGELOG.md's
//! releases and their commits ([`changelog`], which tools outside these checks use too). The
//! checks themselves are this crate's tests.

pub mod changelog;
pub mod modules;
pub mod page;
pub mod tree;
