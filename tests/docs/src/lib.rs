//! What the docs checks read: markdown pages as GitHub renders them ([`page`]) and the
//! repository's files ([`tree`]). The checks themselves are this crate's tests.

pub mod page;
pub mod tree;
