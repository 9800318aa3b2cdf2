//! confirm-deposit against the real MariaDB and RabbitMQ: one CREDIT of the gross amount and
//! one FEE (only when there is a fee) per deposit, however often and however concurrently the
//! confirmation arrives — alone, repeated within one batch, or in concurrent batches.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::sync::Arc;

use paybus_bus::{Context, Envelope, Handler, HandlerError, Message, Outcome, Services};
use paybus_confirm_deposit::ConfirmDeposit;
use paybus_confirmations::{
    ConfirmError, DepositTxConfirmed,
    deposit::{
        Confirmation, Confirmed, Confirming, DepositStatus, confirm_all, confirm_all_if_detected,
        confirm_if_detected,
    },
};
use paybus_ledger::{self as ledger, EntryType, IdemKey, Posted, Posting, ReferenceType};
use paybus_money::Amount;
use paybus_partners::NotificationCreated;
use paybus_testkit::{
    TestEnv,
    confirmations::{assert_audit_clean, deposit},
    dec,
    partners::partner,
    queue_depth, tap,
};
use tokio::{sync::Barrier, task::JoinSet};
use uuid::Uuid;

const TAP: &str = "test.notifications";

/// A test's database and vhost, the services a handler gets, and one partner.
struct World {
    env: TestEnv,
    services: Services,
    partner_id: u64,
}

async fn world() -> World {
    let env = TestEnv::new().await;
    let services = env.services(&[ConfirmDeposit::queue()]).await;
    // A queue of the test's own for `partner.notification.created`, standing in for
    // deliver-webhook's, so the notification messages are routable and can be counted.
    tap(&services, TAP, NotificationCreated::TYPE).await;
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
            db: &self.services.outbox,
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

    /// Messages that reached the broker for deliver-webhook.
    async fn notification_messages(&self) -> u32 {
        let channel = self.services.connection().create_channel().await.unwrap();
        queue_depth(&channel, TAP).await
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

    assert!(matches!(confirmed.credit, Posted::Recorded));
    assert!(matches!(confirmed.fee, Some(Posted::Recorded)));
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
    assert!(matches!(earlier, Posted::Recorded));

    let confirmed = transitioned(world.confirm(id).await.unwrap());

    assert_eq!(
        confirmed.credit,
        Posted::AlreadyRecorded {
            idem_key: IdemKey::deposit_credit(id)
        }
    );
    assert!(matches!(confirmed.fee, Some(Posted::Recorded)));
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

// Batches: what the broker delivered together is confirmed in one transaction, and every
// message still gets the outcome it would have got alone.

impl World {
    async fn confirm_all(&self, deposit_ids: &[u64]) -> Vec<Outcome> {
        let confirmations: Vec<_> = deposit_ids
            .iter()
            .map(|&deposit_id| (DepositTxConfirmed { deposit_id }, Uuid::now_v7()))
            .collect();
        confirm_all(&self.services.outbox, &confirmations)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_within_one_batch_credit_once_and_the_repeats_are_skipped() {
    let world = world().await;
    let first = world.deposit("100", "2", "DETECTED").await;
    let second = world.deposit("30", "0", "DETECTED").await;

    let outcomes = world
        .confirm_all(&[first, first, second, first, second])
        .await;

    let skipped = |id: u64| Outcome::Skipped(format!("deposit {id} is already CONFIRMED"));
    assert_eq!(
        outcomes,
        vec![
            Outcome::Done,
            skipped(first),
            Outcome::Done,
            skipped(first),
            skipped(second)
        ]
    );
    assert_eq!(
        world.entries(first).await,
        vec![credit(first, "100"), fee(first, "2")]
    );
    assert_eq!(world.entries(second).await, vec![credit(second, "30")]);
    for id in [first, second] {
        assert_eq!(world.status(id).await, "CONFIRMED");
        assert_eq!(world.notifications(id).await, 1, "{id}");
    }
    assert_eq!(world.notification_messages().await, 2);
    assert_eq!(world.balance().await, dec("128"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_mixing_missing_confirmed_failed_and_detected_deposits_answers_each_as_alone() {
    let world = world().await;
    let with_fee = world.deposit("250.5", "1.25", "DETECTED").await;
    let without_fee = world.deposit("40", "0", "DETECTED").await;
    let done = world.deposit("10", "1", "DETECTED").await;
    assert_eq!(world.handle(done).await.unwrap(), Outcome::Done);
    let failed = world.deposit("100", "2", "FAILED").await;
    let messages_before = world.notification_messages().await;

    let outcomes = world
        .confirm_all(&[failed, with_fee, 424_242, done, without_fee, with_fee])
        .await;

    assert_eq!(
        outcomes,
        vec![
            Outcome::Failed(format!(
                "deposit {failed} is FAILED, not DETECTED, but its transaction was confirmed on \
                 chain"
            )),
            Outcome::Done,
            Outcome::Failed("deposit 424242 does not exist".to_owned()),
            Outcome::Skipped(format!("deposit {done} is already CONFIRMED")),
            Outcome::Done,
            Outcome::Skipped(format!("deposit {with_fee} is already CONFIRMED")),
        ]
    );
    assert_eq!(
        world.entries(with_fee).await,
        vec![credit(with_fee, "250.5"), fee(with_fee, "1.25")]
    );
    assert_eq!(
        world.entries(without_fee).await,
        vec![credit(without_fee, "40")]
    );
    assert_eq!(
        world.entries(done).await,
        vec![credit(done, "10"), fee(done, "1")]
    );
    assert!(world.entries(failed).await.is_empty());
    assert_eq!(world.status(failed).await, "FAILED");
    for id in [with_fee, without_fee, done] {
        assert_eq!(world.status(id).await, "CONFIRMED");
        assert_eq!(world.notifications(id).await, 1, "{id}");
    }
    assert_eq!(world.notifications(failed).await, 0);
    // One message per new notification, published after the commit.
    assert_eq!(world.notification_messages().await, messages_before + 2);
    // Each payload carries its own deposit and the stored confirmation time.
    let (payload, stored): (String, String) = sqlx::query_as(
        "SELECT n.payload, DATE_FORMAT(d.confirmed_at, '%Y-%m-%dT%H:%i:%s.%fZ') \
         FROM partner_notifications n JOIN deposits d ON d.id = n.reference_id \
         WHERE n.reference_type = 'DEPOSIT' AND n.reference_id = ?",
    )
    .bind(without_fee)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(payload["deposit_id"], without_fee);
    assert_eq!(payload["net_amount"], "40");
    assert_eq!(payload["confirmed_at"], stored.as_str());
    // 10 - 1 earlier, then 250.5 - 1.25 and 40.
    assert_eq!(world.balance().await, dec("298.25"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_fails_goes_again_one_per_transaction_and_each_meets_its_own_fate() {
    let world = world().await;
    let fine = world.deposit("5", "0", "DETECTED").await;
    // The partner's balance sits at the column's top, so this CREDIT cannot be posted: the
    // batch's transaction fails as a whole, and only this deposit's own transaction should.
    let widest = "999999999999999999.999999999999999999";
    let other_partner = partner(&world.env.db, "partner 46", None).await;
    let overflowing = deposit(&world.env.db, other_partner, "DETECTED", "1", "0").await;
    let mut tx = world.env.db.begin().await.unwrap();
    ledger::post(
        &mut tx,
        &Posting::new(
            other_partner,
            "USDT",
            EntryType::Credit,
            dec(widest),
            ReferenceType::Deposit,
            999_999,
        ),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let outcomes = world.confirm_all(&[overflowing, fine, fine]).await;

    assert!(
        matches!(&outcomes[0], Outcome::Failed(reason) if reason.contains("beyond what DECIMAL(36,18) holds")),
        "{:?}",
        outcomes[0]
    );
    assert_eq!(
        outcomes[1..],
        [
            Outcome::Done,
            Outcome::Skipped(format!("deposit {fine} is already CONFIRMED"))
        ]
    );
    assert_eq!(world.status(overflowing).await, "DETECTED");
    assert!(world.entries(overflowing).await.is_empty());
    assert_eq!(world.entries(fine).await, vec![credit(fine, "5")]);
    assert_eq!(world.notifications(fine).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_overlapping_batches_that_all_saw_detected_credit_each_deposit_once() {
    const DEPOSITS: usize = 40;
    const BATCHES: usize = 6;
    let world = Arc::new(world().await);
    let other_partner = partner(&world.env.db, "partner 46", None).await;
    let mut ids = Vec::new();
    for n in 0..DEPOSITS {
        let fee = if n % 2 == 0 { "0.5" } else { "0" };
        ids.push(if n % 3 == 0 {
            deposit(&world.env.db, other_partner, "DETECTED", "10", fee).await
        } else {
            world.deposit("10", fee, "DETECTED").await
        });
    }
    // Every batch holds every deposit, each in its own rotation, in a transaction of its own
    // whose snapshot saw them all DETECTED before any batch wrote.
    let snapshots_taken = Arc::new(Barrier::new(BATCHES));
    let mut batches = JoinSet::new();
    for b in 0..BATCHES {
        let (world, snapshots_taken) = (world.clone(), snapshots_taken.clone());
        let mut rotated = ids.clone();
        rotated.rotate_left(b * 7);
        batches.spawn(async move {
            let batch: Vec<Confirming> = rotated
                .iter()
                .map(|&deposit_id| Confirming {
                    deposit_id,
                    correlation_id: Uuid::now_v7(),
                })
                .collect();
            let mut uow = world.services.outbox.begin().await.unwrap();
            let seen: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM deposits WHERE status = 'DETECTED' AND partner_id IN (?, ?)",
            )
            .bind(world.partner_id)
            .bind(other_partner)
            .fetch_one(&mut *uow)
            .await
            .unwrap();
            snapshots_taken.wait().await;
            let decided = confirm_all_if_detected(&mut uow, &batch).await.unwrap();
            let transitioned = decided
                .iter()
                .filter(|d| matches!(d, Confirmation::Transitioned(_)))
                .count();
            if transitioned > 0 {
                uow.commit().await.unwrap();
            } else {
                uow.rollback().await.unwrap();
            }
            (seen, transitioned)
        });
    }
    let mut transitions = 0;
    while let Some(joined) = batches.join_next().await {
        let (seen, transitioned) = joined.unwrap();
        assert_eq!(seen, DEPOSITS as i64);
        transitions += transitioned;
    }

    assert_eq!(transitions, DEPOSITS);
    for (n, &id) in ids.iter().enumerate() {
        let expected = if n % 2 == 0 {
            vec![credit(id, "10"), fee(id, "0.5")]
        } else {
            vec![credit(id, "10")]
        };
        assert_eq!(world.entries(id).await, expected, "{id}");
        assert_eq!(world.notifications(id).await, 1, "{id}");
        assert_eq!(world.status(id).await, "CONFIRMED");
    }
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_handler_batches_with_overlapping_ids_are_done_once_each() {
    const DEPOSITS: usize = 30;
    const BATCHES: usize = 6;
    let world = Arc::new(world().await);
    let mut ids = Vec::new();
    for _ in 0..DEPOSITS {
        ids.push(world.deposit("1", "0.25", "DETECTED").await);
    }
    let start = Arc::new(Barrier::new(BATCHES));
    let mut batches = JoinSet::new();
    for b in 0..BATCHES {
        let (world, start) = (world.clone(), start.clone());
        // Sixteen ids a batch (the handler's MAX_BATCH), overlapping the next batch's by half.
        let batch: Vec<u64> = (0..16).map(|n| ids[(b * 5 + n) % DEPOSITS]).collect();
        batches.spawn(async move {
            start.wait().await;
            world.confirm_all(&batch).await
        });
    }
    let mut done = 0;
    while let Some(outcomes) = batches.join_next().await {
        for outcome in outcomes.unwrap() {
            match outcome {
                Outcome::Done => done += 1,
                Outcome::Skipped(_) => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }

    // 6 batches of 16 over 30 ids, every id in at least one batch: each done exactly once.
    assert_eq!(done, DEPOSITS);
    for &id in &ids {
        assert_eq!(
            world.entries(id).await,
            vec![credit(id, "1"), fee(id, "0.25")]
        );
        assert_eq!(world.notifications(id).await, 1, "{id}");
    }
    assert_eq!(world.balance().await, dec("22.5"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_over_different_partners_never_deadlock() {
    // As sharded consumers run them: sixteen batches at once, each of sixteen deposits of its
    // own spread over eleven or so of sixteen partners, a different set each, so two batches
    // share some gates and each holds gates the other lacks (and the deposits' id order is
    // not their partners' order). Every batch must commit at the first try: a deadlock is an
    // error here, not a retry.
    const PARTNERS: usize = 16;
    const BATCHES: usize = 16;
    const ROUNDS: usize = 4;
    let world = Arc::new(world().await);
    let mut partners = Vec::new();
    for n in 0..PARTNERS {
        partners.push(partner(&world.env.db, &format!("gate {n}"), None).await);
    }
    for round in 0..ROUNDS {
        let mut work = Vec::new();
        for b in 0..BATCHES {
            let mut batch = Vec::new();
            for n in 0..16 {
                let partner_id = partners[(b * 5 + round * 3 + n * n * 7) % PARTNERS];
                batch.push(deposit(&world.env.db, partner_id, "DETECTED", "1", "0.5").await);
            }
            // Ids in descending order within the batch: the locks must not follow it.
            batch.reverse();
            work.push(batch);
        }
        let start = Arc::new(Barrier::new(BATCHES));
        let mut batches = JoinSet::new();
        for batch in work {
            let (world, start) = (world.clone(), start.clone());
            batches.spawn(async move {
                let batch: Vec<Confirming> = batch
                    .into_iter()
                    .map(|deposit_id| Confirming {
                        deposit_id,
                        correlation_id: Uuid::now_v7(),
                    })
                    .collect();
                start.wait().await;
                let mut uow = world.services.outbox.begin().await.unwrap();
                let decided = confirm_all_if_detected(&mut uow, &batch).await?;
                uow.commit().await.unwrap();
                Ok::<_, ConfirmError>(decided)
            });
        }
        while let Some(joined) = batches.join_next().await {
            let decided = joined.unwrap().unwrap();
            assert!(
                decided
                    .iter()
                    .all(|d| matches!(d, Confirmation::Transitioned(_))),
                "{decided:?}"
            );
        }
    }

    let confirmed: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM deposits WHERE status = 'CONFIRMED'")
            .fetch_one(&world.env.db)
            .await
            .unwrap();
    assert_eq!(confirmed, (ROUNDS * BATCHES * 16) as i64);
    world.assert_audit_clean().await;
}
