//! confirm-withdrawal against the real MariaDB and RabbitMQ: seed 001 §5 as database tests of
//! the transition (`confirm_if_in_flight`, the batch path with one confirmation), and the
//! handler's outcomes.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::sync::Arc;

use paybus_bus::{Context, Envelope, Handler, HandlerError, Message, Outcome, Services};
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_confirmations::{
    ConfirmError, WithdrawalTxConfirmed,
    withdrawal::{
        Confirmation, Confirmed, WithdrawalKind, WithdrawalState, WithdrawalStatus, confirm_all,
        confirm_if_in_flight,
    },
};
use paybus_ledger::{self as ledger, EntryType, IdemKey, Posted, Posting, ReferenceType};
use paybus_money::Amount;
use paybus_partners::NotificationCreated;
use paybus_testkit::{
    TestEnv,
    confirmations::{assert_audit_clean, withdrawal},
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
    let services = env.services(&[ConfirmWithdrawal::queue()]).await;
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
    /// A 100 USDT withdrawal of this kind in this status (broadcast as `0xbroadcast`).
    async fn withdrawal(&self, kind: &str, status: &str) -> u64 {
        let (kind, status) = (kind.parse().unwrap(), status.parse().unwrap());
        withdrawal(&self.env.db, self.partner_id, kind, status, "100").await
    }

    /// Runs `confirm_if_in_flight` in a transaction of its own, committed when it
    /// transitioned and rolled back otherwise (also on an error, explicitly).
    async fn confirm(
        &self,
        withdrawal_id: u64,
        tx_hash: &str,
    ) -> Result<Confirmation, ConfirmError> {
        let mut uow = self.services.outbox.begin().await.unwrap();
        let result = confirm_if_in_flight(&mut uow, withdrawal_id, tx_hash, Uuid::now_v7()).await;
        match &result {
            Ok(Confirmation::Transitioned(_)) => uow.commit().await.unwrap(),
            _ => uow.rollback().await.unwrap(),
        }
        result
    }

    async fn handle(&self, withdrawal_id: u64, tx_hash: &str) -> Result<Outcome, HandlerError> {
        let ctx = Context {
            db: &self.services.outbox,
            attempt: 1,
        };
        ConfirmWithdrawal
            .handle(
                Envelope::new(WithdrawalTxConfirmed {
                    withdrawal_id,
                    tx_hash: tx_hash.to_owned(),
                }),
                &ctx,
            )
            .await
    }

    async fn count(&self, sql: &'static str, withdrawal_id: u64) -> i64 {
        sqlx::query_scalar(sql)
            .bind(withdrawal_id)
            .fetch_one(&self.env.db)
            .await
            .unwrap()
    }

    /// (idem_key, amount) of every DEBIT of this withdrawal.
    async fn debits(&self, withdrawal_id: u64) -> Vec<(Option<String>, Amount)> {
        sqlx::query_as(
            "SELECT idem_key, amount FROM ledger_entries \
             WHERE entry_type = 'DEBIT' AND reference_type = 'WITHDRAWAL' AND reference_id = ? \
             ORDER BY id",
        )
        .bind(withdrawal_id)
        .fetch_all(&self.env.db)
        .await
        .unwrap()
    }

    async fn ledger_entries(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM ledger_entries")
            .fetch_one(&self.env.db)
            .await
            .unwrap()
    }

    async fn history(&self, withdrawal_id: u64) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM withdrawal_status_history WHERE withdrawal_id = ?",
            withdrawal_id,
        )
        .await
    }

    async fn notifications(&self, withdrawal_id: u64) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM partner_notifications \
             WHERE event = 'WITHDRAWAL_CONFIRMED' AND reference_type = 'WITHDRAWAL' \
               AND reference_id = ?",
            withdrawal_id,
        )
        .await
    }

    async fn status(&self, withdrawal_id: u64) -> (String, Option<String>) {
        sqlx::query_as("SELECT status, tx_hash FROM withdrawals WHERE id = ?")
            .bind(withdrawal_id)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn confirming_a_broadcasting_withdrawal_debits_once_with_its_key() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;

    let confirmed = transitioned(world.confirm(id, "0xconfirmed").await.unwrap());

    assert!(
        matches!(confirmed.debit, Some(Posted::Recorded)),
        "{confirmed:?}"
    );
    assert_eq!(confirmed.kind, WithdrawalKind::Normal);
    assert_eq!(confirmed.previous_status, WithdrawalStatus::Broadcasting);
    assert_eq!(
        world.debits(id).await,
        vec![(Some(format!("WDR_CONFIRM:{id}")), dec("100"))]
    );
    assert_eq!(
        world.status(id).await,
        ("CONFIRMED".to_owned(), Some("0xconfirmed".to_owned()))
    );
    let (from, to): (Option<String>, String) = sqlx::query_as(
        "SELECT from_status, to_status FROM withdrawal_status_history WHERE withdrawal_id = ?",
    )
    .bind(id)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    assert_eq!(
        (from.as_deref(), to.as_str()),
        (Some("BROADCASTING"), "CONFIRMED")
    );
    let balance: Amount = sqlx::query_scalar(
        "SELECT balance FROM partner_balances WHERE partner_id = ? AND currency = 'USDT'",
    )
    .bind(world.partner_id)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    assert_eq!(balance, dec("-100"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_widest_and_the_smallest_amounts_are_debited_and_notified_exactly() {
    let world = world().await;
    for amount in [
        "999999999999999999.999999999999999999",
        "0.000000000000000001",
    ] {
        // A partner each: together they would take one balance beyond the column.
        let partner_id = partner(&world.env.db, amount, None).await;
        let id = withdrawal(
            &world.env.db,
            partner_id,
            WithdrawalKind::Normal,
            WithdrawalStatus::Broadcasting,
            amount,
        )
        .await;

        transitioned(world.confirm(id, "0xconfirmed").await.unwrap());

        assert_eq!(
            world.debits(id).await,
            vec![(Some(format!("WDR_CONFIRM:{id}")), dec(amount))]
        );
        let balance: Amount =
            sqlx::query_scalar("SELECT balance FROM partner_balances WHERE partner_id = ?")
                .bind(partner_id)
                .fetch_one(&world.env.db)
                .await
                .unwrap();
        assert_eq!(balance, -dec(amount));
        let payload: String =
            sqlx::query_scalar("SELECT payload FROM partner_notifications WHERE reference_id = ?")
                .bind(id)
                .fetch_one(&world.env.db)
                .await
                .unwrap();
        let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(
            payload["amount"], amount,
            "the partner sees the exact amount"
        );
    }
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processing_and_stale_withdrawals_confirm_too() {
    let world = world().await;
    for status in ["PROCESSING", "STALE"] {
        let id = world.withdrawal("NORMAL", status).await;

        let confirmed = transitioned(world.confirm(id, "0xconfirmed").await.unwrap());

        assert_eq!(confirmed.previous_status.as_str(), status);
        assert_eq!(world.debits(id).await.len(), 1, "{status}");
        assert_eq!(world.status(id).await.0, "CONFIRMED", "{status}");
    }
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_confirmation_writes_no_debit_no_history_and_no_notification() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;
    transitioned(world.confirm(id, "0xfirst").await.unwrap());

    let second = world.confirm(id, "0xsecond").await.unwrap();

    assert_eq!(
        second,
        Confirmation::NotTransitioned {
            current: WithdrawalState {
                status: WithdrawalStatus::Confirmed,
                tx_hash: Some("0xfirst".to_owned()),
            }
        }
    );
    assert_eq!(world.debits(id).await.len(), 1);
    assert_eq!(world.history(id).await, 1);
    assert_eq!(world.notifications(id).await, 1);
    // The first confirmation's tx stays recorded.
    assert_eq!(world.status(id).await.1.as_deref(), Some("0xfirst"));
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn withdrawals_not_in_flight_are_left_alone() {
    let world = world().await;
    for (status, expected) in [
        ("REQUESTED", WithdrawalStatus::Requested),
        ("FAILED", WithdrawalStatus::Failed),
    ] {
        let id = world.withdrawal("NORMAL", status).await;

        let confirmation = world.confirm(id, "0xconfirmed").await.unwrap();

        let Confirmation::NotTransitioned { current } = confirmation else {
            panic!("{status}: {confirmation:?}");
        };
        assert_eq!(current.status, expected);
        assert_eq!(world.status(id).await.0, status);
        assert!(world.debits(id).await.is_empty());
        assert_eq!(world.history(id).await, 0);
        assert_eq!(world.notifications(id).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settlement_withdrawals_and_self_transfers_never_debit() {
    let world = world().await;
    for (kind, expected) in [
        ("SETTLEMENT_WITHDRAW", WithdrawalKind::SettlementWithdraw),
        ("SELF_TRANSFER", WithdrawalKind::SelfTransfer),
    ] {
        let id = world.withdrawal(kind, "BROADCASTING").await;

        let confirmed = transitioned(world.confirm(id, "0xconfirmed").await.unwrap());

        assert_eq!(confirmed.kind, expected);
        assert_eq!(confirmed.debit, None, "{kind}");
        assert_eq!(world.status(id).await.0, "CONFIRMED");
        assert_eq!(world.history(id).await, 1);
        assert_eq!(world.notifications(id).await, 1);
    }
    assert_eq!(world.ledger_entries().await, 0);
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_partner_is_notified_only_by_the_confirmation_that_transitions() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;

    let first = transitioned(world.confirm(id, "0xconfirmed").await.unwrap());
    let second = world.confirm(id, "0xconfirmed").await.unwrap();
    let third = world.confirm(id, "0xconfirmed").await.unwrap();

    let notification_id = first.notification_id.expect("a notification row");
    assert!(matches!(second, Confirmation::NotTransitioned { .. }));
    assert!(matches!(third, Confirmation::NotTransitioned { .. }));
    assert_eq!(world.notifications(id).await, 1);
    let (event, payload): (String, String) =
        sqlx::query_as("SELECT event, payload FROM partner_notifications WHERE id = ?")
            .bind(notification_id)
            .fetch_one(&world.env.db)
            .await
            .unwrap();
    assert_eq!(event, "WITHDRAWAL_CONFIRMED");
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(payload["withdrawal_id"], id);
    assert_eq!(payload["partner_id"], world.partner_id);
    assert_eq!(payload["amount"], "100");
    assert_eq!(payload["currency"], "USDT");
    assert_eq!(payload["tx_hash"], "0xconfirmed");
    // The payload carries the stored confirmation time, to the microsecond.
    let stored: String = sqlx::query_scalar(
        "SELECT DATE_FORMAT(confirmed_at, '%Y-%m-%dT%H:%i:%s.%fZ') FROM withdrawals WHERE id = ?",
    )
    .bind(id)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    assert_eq!(payload["confirmed_at"], stored.as_str(), "{payload}");
    // One message for deliver-webhook, published after the commit.
    assert_eq!(world.notification_messages().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_debit_already_in_the_ledger_is_already_recorded_and_the_rest_commits() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;
    // Some other path wrote the keyed DEBIT already (the last line of defence must hold).
    let mut tx = world.env.db.begin().await.unwrap();
    let earlier = ledger::post(
        &mut tx,
        &Posting::new(
            world.partner_id,
            "USDT",
            EntryType::Debit,
            dec("100"),
            ReferenceType::Withdrawal,
            id,
        )
        .idem_key(IdemKey::withdrawal_confirm(id)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(earlier, Posted::Recorded));

    let confirmed = transitioned(world.confirm(id, "0xconfirmed").await.unwrap());

    assert_eq!(
        confirmed.debit,
        Some(Posted::AlreadyRecorded {
            idem_key: IdemKey::withdrawal_confirm(id)
        })
    );
    // Committed: the transition, its history and its notification, and still one DEBIT.
    assert_eq!(world.status(id).await.0, "CONFIRMED");
    assert_eq!(world.history(id).await, 1);
    assert_eq!(world.notifications(id).await, 1);
    assert_eq!(world.debits(id).await.len(), 1);
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_database_errors_propagate_and_nothing_is_kept() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;
    sqlx::query("DROP TABLE withdrawal_status_history")
        .execute(&world.env.db)
        .await
        .unwrap();

    let result = world.confirm(id, "0xconfirmed").await;

    let error = result.unwrap_err();
    assert!(matches!(error, ConfirmError::Database { .. }), "{error:?}");
    assert!(HandlerError::from(error).is_transient());
    // The helper rolled back: no half-confirmation survives.
    assert_eq!(world.status(id).await.0, "BROADCASTING");
    assert!(world.debits(id).await.is_empty());
    assert_eq!(world.notifications(id).await, 0);
    // Through the handler the same fault is an error (requeue), not a Skipped.
    let handled = world.handle(id, "0xconfirmed").await;
    assert!(
        matches!(handled, Err(HandlerError::Database(_))),
        "{handled:?}"
    );
    assert_eq!(world.status(id).await.0, "BROADCASTING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_confirmations_that_all_saw_broadcasting_debit_once() {
    const WITHDRAWALS: usize = 10;
    const COPIES: usize = 3;
    let world = Arc::new(world().await);
    let mut ids = Vec::new();
    for _ in 0..WITHDRAWALS {
        ids.push(world.withdrawal("NORMAL", "BROADCASTING").await);
    }

    let mut tasks = JoinSet::new();
    for &id in &ids {
        // Every copy takes its snapshot (status BROADCASTING) before any copy updates: the
        // schedule of seed 001's incident.
        let snapshots_taken = Arc::new(Barrier::new(COPIES));
        for _ in 0..COPIES {
            let (world, snapshots_taken) = (world.clone(), snapshots_taken.clone());
            tasks.spawn(async move {
                let mut uow = world.services.outbox.begin().await.unwrap();
                let seen: String =
                    sqlx::query_scalar("SELECT status FROM withdrawals WHERE id = ?")
                        .bind(id)
                        .fetch_one(&mut *uow)
                        .await
                        .unwrap();
                snapshots_taken.wait().await;
                let result =
                    confirm_if_in_flight(&mut uow, id, "0xconfirmed", Uuid::now_v7()).await;
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
        assert_eq!(seen, "BROADCASTING");
        transitions += usize::from(transitioned);
    }

    assert_eq!(transitions, WITHDRAWALS);
    for &id in &ids {
        assert_eq!(world.debits(id).await.len(), 1);
        assert_eq!(world.history(id).await, 1);
        assert_eq!(world.notifications(id).await, 1);
    }
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_messages_are_done_once_then_skipped_with_the_status() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;

    let first = world.handle(id, "0xconfirmed").await.unwrap();
    let second = world.handle(id, "0xconfirmed").await.unwrap();

    assert_eq!(first, Outcome::Done);
    assert_eq!(
        second,
        Outcome::Skipped(format!("withdrawal {id} is already CONFIRMED"))
    );
    assert_eq!(world.debits(id).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_of_a_finished_confirmation_is_answered_without_waiting_for_the_row_lock() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;
    assert_eq!(
        world.handle(id, "0xconfirmed").await.unwrap(),
        Outcome::Done
    );
    // Another transaction holds the withdrawal's row lock (an admin edit, a slow sweep).
    let mut holder = world.env.db.begin().await.unwrap();
    sqlx::query("SELECT id FROM withdrawals WHERE id = ? FOR UPDATE")
        .bind(id)
        .execute(&mut *holder)
        .await
        .unwrap();

    // Taking the lock would wait innodb_lock_wait_timeout (50 s) and fail; the committed read
    // answers at once.
    let duplicate = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        world.handle(id, "0xconfirmed"),
    )
    .await
    .expect("the duplicate did not wait for the row lock")
    .unwrap();

    assert_eq!(
        duplicate,
        Outcome::Skipped(format!("withdrawal {id} is already CONFIRMED"))
    );
    holder.rollback().await.unwrap();
    assert_eq!(world.debits(id).await.len(), 1);
}

// Seed 001 and principle 9: an on-chain transaction for a withdrawal we never sent, or marked
// FAILED, or confirmed under another tx, is for ops to see: a dead letter, never a quiet skip.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_confirmation_of_a_withdrawal_not_in_flight_is_a_dead_letter_naming_the_tx() {
    let world = world().await;
    for status in ["FAILED", "REQUESTED"] {
        let id = world.withdrawal("NORMAL", status).await;

        let outcome = world.handle(id, "0xunexpected").await.unwrap();

        let recorded = if status == "REQUESTED" {
            "none"
        } else {
            "0xbroadcast"
        };
        assert_eq!(
            outcome,
            Outcome::Failed(format!(
                "withdrawal {id} is {status}, not in flight, but tx 0xunexpected was confirmed \
                 on chain for it (recorded tx: {recorded})"
            ))
        );
        assert_eq!(world.status(id).await.0, status);
        assert!(world.debits(id).await.is_empty());
        assert_eq!(world.notifications(id).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_confirmation_naming_another_tx_for_a_confirmed_withdrawal_is_a_dead_letter() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;
    assert_eq!(world.handle(id, "0xfirst").await.unwrap(), Outcome::Done);

    let same = world.handle(id, "0xfirst").await.unwrap();
    let other = world.handle(id, "0xsecond").await.unwrap();

    assert_eq!(
        same,
        Outcome::Skipped(format!("withdrawal {id} is already CONFIRMED"))
    );
    assert_eq!(
        other,
        Outcome::Failed(format!(
            "withdrawal {id} is already CONFIRMED with tx 0xfirst, but this confirmation \
             names tx 0xsecond"
        ))
    );
    assert_eq!(world.debits(id).await.len(), 1);
    assert_eq!(world.status(id).await.1.as_deref(), Some("0xfirst"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_withdrawal_is_a_dead_letter() {
    let world = world().await;

    let outcome = world.handle(424_242, "0xconfirmed").await.unwrap();

    assert_eq!(
        outcome,
        Outcome::Failed("withdrawal 424242 does not exist".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_confirmation_without_a_tx_hash_is_a_dead_letter_and_changes_nothing() {
    let world = world().await;
    let id = world.withdrawal("NORMAL", "BROADCASTING").await;

    let outcome = world.handle(id, "").await.unwrap();

    assert!(
        matches!(&outcome, Outcome::Failed(reason) if reason.contains("tx hash")),
        "{outcome:?}"
    );
    assert_eq!(world.status(id).await.0, "BROADCASTING");
    assert!(world.debits(id).await.is_empty());
}

// Batches: what the broker delivered together is confirmed in one transaction,
// and every message still gets the outcome it would have got alone.

impl World {
    async fn confirm_all(
        &self,
        confirmations: &[(u64, &str)],
    ) -> Vec<Result<Outcome, HandlerError>> {
        let confirmations: Vec<_> = confirmations
            .iter()
            .map(|&(withdrawal_id, tx_hash)| {
                (
                    WithdrawalTxConfirmed {
                        withdrawal_id,
                        tx_hash: tx_hash.to_owned(),
                    },
                    Uuid::now_v7(),
                )
            })
            .collect();
        confirm_all(&self.services.outbox, &confirmations).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_answers_every_confirmation_as_it_would_be_answered_alone() {
    let world = world().await;
    let normal = world.withdrawal("NORMAL", "BROADCASTING").await;
    let settlement = world.withdrawal("SETTLEMENT_WITHDRAW", "PROCESSING").await;
    let stale = world.withdrawal("NORMAL", "STALE").await;
    let done = world.withdrawal("NORMAL", "BROADCASTING").await;
    assert_eq!(world.handle(done, "0xdone").await.unwrap(), Outcome::Done);
    let failed = world.withdrawal("NORMAL", "FAILED").await;
    let messages_before = world.notification_messages().await;

    let outcomes = world
        .confirm_all(&[
            (normal, "0xnormal"),
            (settlement, "0xsettlement"),
            (done, "0xdone"),
            (failed, "0xfailed"),
            (424_242, "0xunknown"),
            (normal, "0xnormal"),
            (stale, "0xstale"),
            (normal, "0xother"),
            (stale, ""),
        ])
        .await;

    let outcomes: Vec<Outcome> = outcomes.into_iter().map(Result::unwrap).collect();
    assert_eq!(outcomes[0], Outcome::Done);
    assert_eq!(outcomes[1], Outcome::Done);
    assert_eq!(
        outcomes[2],
        Outcome::Skipped(format!("withdrawal {done} is already CONFIRMED"))
    );
    assert_eq!(
        outcomes[3],
        Outcome::Failed(format!(
            "withdrawal {failed} is FAILED, not in flight, but tx 0xfailed was confirmed on \
             chain for it (recorded tx: 0xbroadcast)"
        ))
    );
    assert_eq!(
        outcomes[4],
        Outcome::Failed("withdrawal 424242 does not exist".to_owned())
    );
    assert_eq!(
        outcomes[5],
        Outcome::Skipped(format!("withdrawal {normal} is already CONFIRMED"))
    );
    assert_eq!(outcomes[6], Outcome::Done);
    assert_eq!(
        outcomes[7],
        Outcome::Failed(format!(
            "withdrawal {normal} is already CONFIRMED with tx 0xnormal, but this confirmation \
             names tx 0xother"
        ))
    );
    assert!(
        matches!(&outcomes[8], Outcome::Failed(reason) if reason.contains("tx hash")),
        "{:?}",
        outcomes[8]
    );

    for (id, tx_hash) in [
        (normal, "0xnormal"),
        (settlement, "0xsettlement"),
        (stale, "0xstale"),
    ] {
        assert_eq!(
            world.status(id).await,
            ("CONFIRMED".to_owned(), Some(tx_hash.to_owned()))
        );
        assert_eq!(world.history(id).await, 1, "{id}");
        assert_eq!(world.notifications(id).await, 1, "{id}");
    }
    assert_eq!(
        world.debits(normal).await,
        vec![(Some(format!("WDR_CONFIRM:{normal}")), dec("100"))]
    );
    assert_eq!(world.debits(stale).await.len(), 1);
    assert!(world.debits(settlement).await.is_empty());
    assert_eq!(world.status(failed).await.0, "FAILED");
    // One message per new notification, published after the commit.
    assert_eq!(world.notification_messages().await, messages_before + 3);
    // Each payload carries its own withdrawal and the stored confirmation time.
    let (payload, stored): (String, String) = sqlx::query_as(
        "SELECT n.payload, DATE_FORMAT(w.confirmed_at, '%Y-%m-%dT%H:%i:%s.%fZ') \
         FROM partner_notifications n JOIN withdrawals w ON w.id = n.reference_id \
         WHERE n.reference_id = ?",
    )
    .bind(stale)
    .fetch_one(&world.env.db)
    .await
    .unwrap();
    let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(payload["withdrawal_id"], stale);
    assert_eq!(payload["tx_hash"], "0xstale");
    assert_eq!(payload["confirmed_at"], stored.as_str());
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_meeting_a_debit_already_in_the_ledger_confirms_each_once() {
    let world = world().await;
    let first = world.withdrawal("NORMAL", "BROADCASTING").await;
    let second = world.withdrawal("NORMAL", "BROADCASTING").await;
    // Some other path wrote the second's keyed DEBIT already: the ledger finds the key
    // (AlreadyRecorded) and the batch still commits both transitions.
    let mut tx = world.env.db.begin().await.unwrap();
    ledger::post(
        &mut tx,
        &Posting::new(
            world.partner_id,
            "USDT",
            EntryType::Debit,
            dec("100"),
            ReferenceType::Withdrawal,
            second,
        )
        .idem_key(IdemKey::withdrawal_confirm(second)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let outcomes = world
        .confirm_all(&[(first, "0xfirst"), (second, "0xsecond")])
        .await;

    assert_eq!(
        outcomes.into_iter().map(Result::unwrap).collect::<Vec<_>>(),
        vec![Outcome::Done, Outcome::Done]
    );
    for id in [first, second] {
        assert_eq!(world.status(id).await.0, "CONFIRMED");
        assert_eq!(world.debits(id).await.len(), 1, "{id}");
        assert_eq!(world.history(id).await, 1, "{id}");
        assert_eq!(world.notifications(id).await, 1, "{id}");
    }
    world.assert_audit_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_overlapping_batches_confirm_each_withdrawal_exactly_once() {
    const WITHDRAWALS: usize = 40;
    const BATCHES: usize = 6;
    let world = Arc::new(world().await);
    let other_partner = partner(&world.env.db, "partner 46", None).await;
    let mut ids = Vec::new();
    for n in 0..WITHDRAWALS {
        ids.push(if n % 3 == 0 {
            withdrawal(
                &world.env.db,
                other_partner,
                WithdrawalKind::Normal,
                WithdrawalStatus::Broadcasting,
                "2.5",
            )
            .await
        } else {
            world.withdrawal("NORMAL", "BROADCASTING").await
        });
    }
    // Every batch holds every withdrawal, each in its own rotation, all started together.
    let start = Arc::new(Barrier::new(BATCHES));
    let mut batches = JoinSet::new();
    for b in 0..BATCHES {
        let (world, start) = (world.clone(), start.clone());
        let mut rotated = ids.clone();
        rotated.rotate_left(b * 7);
        batches.spawn(async move {
            let confirmations: Vec<(u64, &str)> =
                rotated.iter().map(|&id| (id, "0xconfirmed")).collect();
            start.wait().await;
            world.confirm_all(&confirmations).await
        });
    }
    let mut done = 0;
    while let Some(outcomes) = batches.join_next().await {
        for outcome in outcomes.unwrap() {
            match outcome.unwrap() {
                Outcome::Done => done += 1,
                Outcome::Skipped(_) => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }

    assert_eq!(done, WITHDRAWALS);
    for &id in &ids {
        assert_eq!(world.debits(id).await.len(), 1, "{id}");
        assert_eq!(world.notifications(id).await, 1, "{id}");
        assert_eq!(world.history(id).await, 1, "{id}");
    }
    world.assert_audit_clean().await;
}
