//! Fixtures for tests (feature `test-harness`): withdrawals and deposits as the signer and the
//! chain monitor's detection would have written them, and the audit W2 must pass.

use paybus_money::dec;
use paybus_platform::{audit::Check, testing::assert_audit_clean as assert_clean};
use sqlx::MySqlPool;

use crate::withdrawal::{WithdrawalKind, WithdrawalStatus};

/// The tx hash fixture withdrawals in flight were broadcast with.
pub const BROADCAST_TX: &str = "0xbroadcast";

/// A USDT withdrawal of `amount`. In flight or confirmed, it carries [`BROADCAST_TX`]; a
/// CONFIRMED one also its `confirmed_at`.
pub async fn withdrawal(
    pool: &MySqlPool,
    partner_id: u64,
    kind: WithdrawalKind,
    status: WithdrawalStatus,
    amount: &str,
) -> u64 {
    let broadcast = !matches!(status, WithdrawalStatus::Requested);
    sqlx::query(
        "INSERT INTO withdrawals (partner_id, kind, status, currency, amount, to_address, \
         tx_hash, confirmed_at) \
         VALUES (?, ?, ?, 'USDT', ?, 'T-address', ?, IF(? = 'CONFIRMED', NOW(6), NULL))",
    )
    .bind(partner_id)
    .bind(kind.as_str())
    .bind(status.as_str())
    .bind(dec(amount))
    .bind(broadcast.then_some(BROADCAST_TX))
    .bind(status.as_str())
    .execute(pool)
    .await
    .expect("insert a withdrawal")
    .last_insert_id()
}

/// A USDT deposit of `amount` with `fee`, in `status` ("DETECTED", "CONFIRMED", "FAILED"),
/// on a tx hash of its own.
pub async fn deposit(
    pool: &MySqlPool,
    partner_id: u64,
    status: &str,
    amount: &str,
    fee: &str,
) -> u64 {
    sqlx::query(
        "INSERT INTO deposits (partner_id, currency, amount, fee, tx_hash, to_address, status, \
         confirmed_at) \
         VALUES (?, 'USDT', ?, ?, CONCAT('0x', REPLACE(UUID(), '-', '')), 'D-address', ?, \
                 IF(? = 'CONFIRMED', NOW(6), NULL))",
    )
    .bind(partner_id)
    .bind(dec(amount))
    .bind(dec(fee))
    .bind(status)
    .bind(status)
    .execute(pool)
    .await
    .expect("insert a deposit")
    .last_insert_id()
}

/// The invariants W2's rows must keep: the ledger's and W2's own.
pub const AUDIT: &[&[Check]] = &[paybus_ledger::audit::CHECKS, crate::audit::CHECKS];

/// Fails the test on any violation of [`AUDIT`].
pub async fn assert_audit_clean(pool: &MySqlPool) {
    assert_clean(pool, AUDIT).await;
}
