//! End-to-end scenarios live in `tests/`; this crate has no library code of its own.
