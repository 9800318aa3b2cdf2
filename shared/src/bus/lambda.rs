//! The Lambda adapter (written by a helper; see the task).
