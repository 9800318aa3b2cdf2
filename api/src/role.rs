//! The roles the admin API and the console know; a caller's come from its credential
//! ([`crate::auth`]).

paybus_db::column_enum! {
    /// What a caller may do.
    pub enum Role {
        /// Reads: the views of every workflow, dead letters, the audit.
        Ops,
        /// Changes (create, retry, replay, suspend, ...) and reads.
        Admin,
    }
}
