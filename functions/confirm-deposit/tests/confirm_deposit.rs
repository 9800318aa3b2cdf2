//! confirm-deposit against the real MariaDB and RabbitMQ: one CREDIT of the gross amount and
//! one FEE (only when there is a fee) per deposit, however often and however concurrently the
//! confirmation arrives.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::sync::Arc;

use paybus_confirm_deposit::{
    ConfirmDeposit, Confirmation, Confirmed, DepositStatus, DepositTxConfirmed, confirm_if_detected,
};
use paybus_confirmations::{
    ConfirmError,
    testing::{assert_audit_clean, deposit},
};
use paybus_ledger::{self as ledger, EntryType, IdemKey, Posted, Posting, ReferenceType};
use paybus_money::{Amount, dec};
use paybus_partners::testing::partner;
use paybus_platform::{
    bus::{Context, Envelope, Handler, HandlerError, Outcome, Services},
    testing::TestEnv,
};
use tokio::{sync::Barrier, task::JoinSet};
use uuid::Uuid;

/// A test's database and vhost, the services a handler gets, and one partner.
struct World {
    env: TestEnv,
    services: Services,
    partner_id: u64,
}

async fn world() -> World {
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmDeposit::queue()]).await;
    let partner_id = partner(&env.db, "partner 45", Some("http://127.0.0.1:9/webhook")).await;
    World {
        env,
        services,
        partner_id,
    }
}

impl World {
    /// A deposit of `amount` USDT with `fee`, in `status`, on a tx of its own.
    async fn deposit(&self, amount: &str, fee: &str, status: &str) -> u64 {
        deposit(&self.env.db, self.partner_id, status, amount, fee).await
    }

    /// Runs `confirm_if_detected` in a transaction of its own, committed when it
    /// transitioned and rolled back otherwise (also on an error, explicitly).
    async fn confirm(&self, deposit_id: u64) -> Result<Confirmation, ConfirmError> {
        let mut uow = self.services.outbox.begin().await.unwrap();
        let result = confirm_if_detected(&mut uow, deposit_id, Uuid::now_v7()).await;
        match &result {
            Ok(Confirmation::Transitioned(_)) => uow.commit().await.unwrap(),
            _ => uow.rollback().await.unwrap(),
        }
        result
    }

    async fn handle(&self, deposit_id: u64) -> Result<Outcome, HandlerError> {
        let ctx = Context {
            outbox: &self.services.outbox,
            attempt: 1,
        };
        ConfirmDeposit
            .handle(Envelope::new(DepositTxConfirmed { deposit_id }), &ctx)
            .await
    }

    /// (entry_type, idem_key, amount) of every entry of this deposit.
    async fn entries(&self, deposit_id: u64) -> Vec<(String, Option<String>, Amount)> {
        sqlx::query_as(
            "SELECT entry_type, idem_key, amount FROM ledger_entries \
             WHERE reference_type = 'DEPOSIT' AND reference_id = ? ORDER BY id",
        )
        .bind(deposit_id)
        .fetch_all(&self.env.db)
        .await
        .unwrap()
    }

    async fn notifications(&self, deposit_id: u64) -> i64 {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM partner_notifications \
             WHERE event = 'DEPOSIT_CONFIRMED' AND reference_type = 'DEPOSIT' \
               AND reference_id = ?",
        )
        .bind(deposit_id)
        .fetch_one(&self.env.db)
        .await
        .unwrap()
    }

    async fn status(&self, deposit_id: u64) -> String {
        sqlx::query_scalar("SELECT status FROM deposits WHERE id = ?")
            .bind(deposit_id)
            .fetch_one(&self.env.db)
            .await
            .unwrap()
    }

    async fn balance(&self) -> Amount {
        sqlx::query_scalar(
            "SELECT balance FROM partner_balances WHERE partner_id = ? AND currency = 'USDT'",
        )
        .bind(self.partner_id)
        .fetch_one(&self.env.db)
        .await
        .unwrap()
    }

    async fn assert_audit_clean(&self) {
        assert_audit_clean(&self.env.db).await;
    }
}

fn transitioned(confirmation: Confirmation) -> Confirmed {
    match confirmation {
        Confirmation::Transitioned(confirmed) => confirmed,
        other => panic!("expected a transition, got {other:?}"),
    }
}

fn credit(id: u64, amount: &str) -> (String, Option<String>, Amount) {
    (
        "CREDIT".to_owned(),
        Some(format!("DEP_CREDIT:{id}")),
        dec(amount),
    )
}

fn fee(id: u64, amount: &str) -> (String, Option<String>, Amount) {
    ("FEE".to_owned(), Some(format!("DEP_FEE:{id}")), dec(amount))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_widest_amount_and_the_smallest_fee_are_posted_and_notified_exactly() {
    let world = world().await;
    let widest = "999999999999999999.999999999999999999";
    let id = world
        .deposit(widest, "0.000000000000000001", "DETECTED")
        .await;

    transitioned(world.confirm(id).await.unwrap());

    assert_eq!(
        world.entries(id).await,
        vec![credit(id, widest), fee(id, "0.000000000000000001")]
    );
    assert_eq!(
        world.balance().await,
        dec("999999999999999999.999999999999999998")
    );
    let payload: String =
        sqlx::query_scalar("SELECT payload FROM partner_notifications WHERE reference_id = ?")
            .bind(id)
            .fetch_one(&world.env.db)
            .await
            .unwrap();
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(payload["amount"], widest);
    assert_eq!(payload["fee"], "0.000000000000000001");
    assert_eq!(
        payload["net_amount"],
        "999999999999999999.999999999999999998"
    );
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirming_a_deposit_credits_the_gross_amount_and_records_the_fee() {
    let world = world().await;
    let id = world.deposit("250.5", "1.25", "DETECTED").await;

    let confirmed = transitioned(world.confirm(id).await.unwrap());

    assert!(matches!(confirmed.credit, Posted::Recorded { .. }));
    assert!(matches!(confirmed.fee, Some(Posted::Recorded { .. })));
    assert_eq!(
        world.entries(id).await,
        vec![credit(id, "250.5"), fee(id, "1.25")]
    );
    assert_eq!(world.balance().await, dec("249.25"));
    assert_eq!(world.status(id).await, "CONFIRMED");
    let payload: String = sqlx::query_scalar(
        "SELECT payload FROM partner_notifications WHERE event = 'DEPOSIT_CONFIRMED' \
         AND reference_id = ?",
    )
    .bind(id)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(payload["deposit_id"], id);
    assert_eq!(
        (&payload["amount"], &payload["fee"], &payload["net_amount"]),
        (
            &serde_json::json!("250.5"),
            &serde_json::json!("1.25"),
            &serde_json::json!("249.25")
        )
    );
    // The payload carries the stored confirmation time, to the microsecond.
    let stored: String = sqlx::query_scalar(
        "SELECT DATE_FORMAT(confirmed_at, '%Y-%m-%dT%H:%i:%s.%fZ') FROM deposits WHERE id = ?",
    )
    .bind(id)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    assert_eq!(payload["confirmed_at"], stored.as_str(), "{payload}");
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deposit_without_a_fee_gets_no_fee_entry() {
    let world = world().await;
    let id = world.deposit("40", "0", "DETECTED").await;

    let confirmed = transitioned(world.confirm(id).await.unwrap());

    assert_eq!(confirmed.fee, None);
    assert_eq!(world.entries(id).await, vec![credit(id, "40")]);
    assert_eq!(world.balance().await, dec("40"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_confirmations_credit_once_and_charge_the_fee_once() {
    let world = world().await;
    let id = world.deposit("100", "2", "DETECTED").await;

    let outcomes = [
        world.handle(id).await.unwrap(),
        world.handle(id).await.unwrap(),
        world.handle(id).await.unwrap(),
    ];

    let skipped = Outcome::Skipped(format!("deposit {id} is already CONFIRMED"));
    assert_eq!(outcomes, [Outcome::Done, skipped.clone(), skipped]);
    assert_eq!(
        world.entries(id).await,
        vec![credit(id, "100"), fee(id, "2")]
    );
    assert_eq!(world.notifications(id).await, 1);
    assert_eq!(world.balance().await, dec("98"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicate_confirmations_credit_once_and_charge_the_fee_once() {
    const DEPOSITS: usize = 10;
    const COPIES: usize = 3;
    let world = Arc::new(world().await);
    let mut ids = Vec::new();
    for n in 0..DEPOSITS {
        // Every other deposit has no fee.
        let fee = if n % 2 == 0 { "0.5" } else { "0" };
        ids.push(world.deposit("10", fee, "DETECTED").await);
    }

    let mut tasks = JoinSet::new();
    for &id in &ids {
        // Every copy sees DETECTED in its snapshot before any copy updates.
        let snapshots_taken = Arc::new(Barrier::new(COPIES));
        for _ in 0..COPIES {
            let (world, snapshots_taken) = (world.clone(), snapshots_taken.clone());
            tasks.spawn(async move {
                let mut uow = world.services.outbox.begin().await.unwrap();
                let seen: String = sqlx::query_scalar("SELECT status FROM deposits WHERE id = ?")
                    .bind(id)
                    .fetch_one(&mut *uow)
                    .await
                    .unwrap();
                snapshots_taken.wait().await;
                let result = confirm_if_detected(&mut uow, id, Uuid::now_v7()).await;
                let transitioned = matches!(result, Ok(Confirmation::Transitioned(_)));
                if transitioned {
                    uow.commit().await.unwrap();
                } else {
                    uow.rollback().await.unwrap();
                }
                result.unwrap();
                (seen, transitioned)
            });
        }
    }
    let mut transitions = 0;
    while let Some(joined) = tasks.join_next().await {
        let (seen, transitioned) = joined.unwrap();
        assert_eq!(seen, "DETECTED");
        transitions += usize::from(transitioned);
    }

    assert_eq!(transitions, DEPOSITS);
    for (n, &id) in ids.iter().enumerate() {
        let expected = if n % 2 == 0 {
            vec![credit(id, "10"), fee(id, "0.5")]
        } else {
            vec![credit(id, "10")]
        };
        assert_eq!(world.entries(id).await, expected);
        assert_eq!(world.notifications(id).await, 1);
    }
    // 10 deposits of 10, five of them with a fee of 0.5.
    assert_eq!(world.balance().await, dec("97.5"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_credit_already_in_the_ledger_is_already_recorded_and_the_rest_commits() {
    let world = world().await;
    let id = world.deposit("100", "2", "DETECTED").await;
    let mut tx = world.env.db.begin().await.unwrap();
    let earlier = ledger::post(
        &mut tx,
        &Posting::new(
            world.partner_id,
            "USDT",
            EntryType::Credit,
            dec("100"),
            ReferenceType::Deposit,
            id,
        )
        .idem_key(IdemKey::deposit_credit(id)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(earlier, Posted::Recorded { .. }));

    let confirmed = transitioned(world.confirm(id).await.unwrap());

    assert_eq!(
        confirmed.credit,
        Posted::AlreadyRecorded {
            idem_key: IdemKey::deposit_credit(id)
        }
    );
    assert!(matches!(confirmed.fee, Some(Posted::Recorded { .. })));
    assert_eq!(world.status(id).await, "CONFIRMED");
    assert_eq!(
        world.entries(id).await,
        vec![credit(id, "100"), fee(id, "2")]
    );
    assert_eq!(world.notifications(id).await, 1);
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_confirmation_of_a_failed_deposit_is_a_dead_letter_and_nothing_is_credited() {
    let world = world().await;
    let id = world.deposit("100", "2", "FAILED").await;

    let confirmation = world.confirm(id).await.unwrap();
    let outcome = world.handle(id).await.unwrap();

    assert_eq!(
        confirmation,
        Confirmation::NotTransitioned {
            current: DepositStatus::Failed
        }
    );
    assert_eq!(
        outcome,
        Outcome::Failed(format!(
            "deposit {id} is FAILED, not DETECTED, but its transaction was confirmed on chain"
        ))
    );
    assert_eq!(world.status(id).await, "FAILED");
    assert!(world.entries(id).await.is_empty());
    assert_eq!(world.notifications(id).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_deposit_is_a_dead_letter() {
    let world = world().await;

    let outcome = world.handle(424_242).await.unwrap();

    assert_eq!(
        outcome,
        Outcome::Failed("deposit 424242 does not exist".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_database_errors_propagate_and_nothing_is_kept() {
    let world = world().await;
    let id = world.deposit("100", "2", "DETECTED").await;
    sqlx::query("DROP TABLE partner_notifications")
        .execute(&world.env.db)
        .await
        .unwrap();

    let error = world.confirm(id).await.unwrap_err();

    assert!(HandlerError::from(error).is_transient());
    assert_eq!(world.status(id).await, "DETECTED");
    assert!(world.entries(id).await.is_empty());
    let handled = world.handle(id).await;
    assert!(
        matches!(handled, Err(HandlerError::Database(_))),
        "{handled:?}"
    );
    assert_eq!(world.status(id).await, "DETECTED");
}
