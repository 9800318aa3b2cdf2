//! What inserting an order did, for deposit and withdraw orders alike: a repeated partner
//! reference or idempotency key is a retried request's expected outcome, not an error.

/// What [`deposit_order::insert`](crate::deposit_order::insert) or
/// [`withdraw_order::create`](crate::withdraw_order::create) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// A new order (a deposit order PENDING, or MATCHING under its creator's claim:
    /// [`Start`](crate::deposit_order::Start)).
    New(u64),
    /// The partner already created an order with this reference (or under this idempotency
    /// key): nothing was written.
    Existing(u64),
}
