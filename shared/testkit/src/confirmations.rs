//! W2's fixtures: withdrawals and deposits as the signer and the chain monitor's detection would
//! have written them, the audit W2 must pass, and the seed's read-then-update it is raced against.

use paybus_confirmations::withdrawal::{WithdrawalKind, WithdrawalStatus};
use paybus_ledger::{self as ledger, EntryType, Posting, ReferenceType};
use paybus_money::Amount;
use paybus_ops::audit::Check;
use sqlx::{MySqlConnection, MySqlPool};

use crate::dec;

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
pub const AUDIT: &[&[Check]] = &[
    paybus_ledger::audit::CHECKS,
    paybus_confirmations::audit::CHECKS,
];

/// Fails the test on any violation of [`AUDIT`].
pub async fn assert_audit_clean(pool: &MySqlPool) {
    crate::assert_audit_clean(pool, AUDIT).await;
}

/// The seed's original `onTxConfirmed` (seed 001 §1), kept only to prove the hazard: by the
/// W2 race test's control, and by the deliberately broken build `paybus-lab chaos` must catch.
/// `findById` (a plain read: the REPEATABLE READ snapshot), `status == BROADCASTING`, then
/// `between` (the window between the read and the write: the incident's 64 seconds), an
/// unconditional overwrite (`modify()`), a DEBIT without idempotency key, the history row
/// and the notification. Returns whether it debited.
pub async fn read_then_update(
    conn: &mut MySqlConnection,
    withdrawal_id: u64,
    tx_hash: &str,
    between: impl Future,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let (status, partner_id, amount): (String, u64, Amount) =
        sqlx::query_as("SELECT status, partner_id, amount FROM withdrawals WHERE id = ?")
            .bind(withdrawal_id)
            .fetch_one(&mut *conn)
            .await?;
    between.await;
    if !["BROADCASTING", "PROCESSING", "STALE"].contains(&status.as_str()) {
        return Ok(false);
    }
    sqlx::query(
        "UPDATE withdrawals SET status = 'CONFIRMED', tx_hash = ?, confirmed_at = NOW(6) \
         WHERE id = ?",
    )
    .bind(tx_hash)
    .bind(withdrawal_id)
    .execute(&mut *conn)
    .await?;
    ledger::post(
        conn,
        &Posting::new(
            partner_id,
            "USDT",
            EntryType::Debit,
            amount,
            ReferenceType::Withdrawal,
            withdrawal_id,
        ),
    )
    .await?;
    sqlx::query(
        "INSERT INTO withdrawal_status_history (withdrawal_id, from_status, to_status) \
         VALUES (?, ?, 'CONFIRMED')",
    )
    .bind(withdrawal_id)
    .bind(&status)
    .execute(&mut *conn)
    .await?;
    // The seed's table had no unique key here and sent two webhooks; ours ignores the copy.
    sqlx::query(
        "INSERT IGNORE INTO partner_notifications \
         (partner_id, event, reference_type, reference_id, payload) \
         VALUES (?, 'WITHDRAWAL_CONFIRMED', 'WITHDRAWAL', ?, '{}')",
    )
    .bind(partner_id)
    .bind(withdrawal_id)
    .execute(&mut *conn)
    .await?;
    Ok(true)
}
