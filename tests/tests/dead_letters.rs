//! Dead-letter triage and replay against real rows: groups with the money at
//! stake, the dry run's verdicts, and a replay that sends only what is safe and applies it
//! once, through the outbox, the broker and the function.

use std::time::Duration;

use chrono::{DateTime, Utc};

use paybus_bus::{
    Envelope, Message, OutgoingMessage, Services,
    dead_letter::{group_counts, record_given_up},
};
use paybus_confirm_withdrawal::ConfirmWithdrawal;
use paybus_confirmations::{
    DepositTxConfirmed, WithdrawalTxConfirmed,
    withdrawal::{WithdrawalKind, WithdrawalStatus},
};
use paybus_dead_letter_ops::{
    DeadLetterError, ExecuteOptions, ExecutionReport, OperationAction, OperationStatus, Selection,
    Triager, detail, groups, operation, replay,
};
use paybus_ops::approvals::FourEyes as Policy;
use paybus_ops::{audit, triage::Verdict};
use paybus_runtime::runner::Runner;
use paybus_testkit::{
    TestEnv,
    confirmations::{BROADCAST_TX, deposit, withdrawal},
    dec, eventually,
};
use sqlx::MySqlPool;
use tokio_util::sync::CancellationToken;

use crate::outcome_counts::OutcomeCounts;

const TRIAGER: Triager = Triager::new(paybus_catalog::FUNCTIONS);

/// Records `data` as a dead letter of `function` (reason `failed`), as a function that gave
/// the message up writes it. Returns the letter's id.
async fn dead_letter<M: Message>(pool: &MySqlPool, function: &str, data: M) -> u64 {
    let message = Envelope::new(data).to_outgoing().unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let key = format!("{function}:{}", message.id);
    assert!(
        record_given_up(&mut conn, function, &key, &message, "boom", 4)
            .await
            .unwrap()
    );
    sqlx::query_scalar("SELECT id FROM dead_letters WHERE dead_letter_id = ?")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn confirmation(withdrawal_id: u64) -> WithdrawalTxConfirmed {
    WithdrawalTxConfirmed {
        withdrawal_id,
        tx_hash: BROADCAST_TX.to_owned(),
    }
}

async fn in_flight(pool: &MySqlPool, partner: u64, amount: &str) -> u64 {
    withdrawal(
        pool,
        partner,
        WithdrawalKind::Normal,
        WithdrawalStatus::Broadcasting,
        amount,
    )
    .await
}

async fn debits(pool: &MySqlPool, withdrawal_id: u64) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM ledger_entries \
         WHERE reference_type = 'WITHDRAWAL' AND reference_id = ? AND entry_type = 'DEBIT'",
    )
    .bind(withdrawal_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn confirmations_sent(pool: &MySqlPool) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'withdrawal.tx_confirmed'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

fn group() -> Selection {
    Selection::Group {
        function: "confirm-withdrawal".to_owned(),
        reason: "failed".to_owned(),
    }
}

fn fast() -> ExecuteOptions {
    ExecuteOptions {
        per_second: 1_000.0,
        ..ExecuteOptions::default()
    }
}

/// An operation over `selection` requested and executed at once by `actor`, without four-eyes
/// (what the API's one-call routes do when the policy lets them).
async fn act_now(
    services: &Services,
    action: OperationAction,
    selection: &Selection,
    actor: &str,
) -> ExecutionReport {
    let requested = operation::request(
        &services.pool,
        &TRIAGER,
        action,
        selection,
        &paybus_testkit::person(actor),
        500,
        &Policy::off(),
    )
    .await
    .unwrap();
    assert_eq!(requested.operation.status, OperationStatus::Ready);
    operation::execute(
        &services.outbox,
        &TRIAGER,
        requested.operation.id,
        &paybus_testkit::person(actor),
        fast(),
        |_| {},
    )
    .await
    .unwrap()
}

async fn setup() -> (TestEnv, Services, u64) {
    let env = TestEnv::new().await;
    let services = env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    let partner = paybus_testkit::partners::partner(&services.pool, "acme", None).await;
    (env, services, partner)
}

#[tokio::test]
async fn a_confirmation_whose_withdrawal_was_confirmed_since_is_already_applied_and_not_sent() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let id = in_flight(pool, partner, "100").await;
    let letter_id = dead_letter(pool, "confirm-withdrawal", confirmation(id)).await;
    // Confirmed since, by a later copy of the same confirmation.
    let outcome = paybus_confirmations::withdrawal::confirm(
        &services.outbox,
        &confirmation(id),
        uuid::Uuid::now_v7(),
    )
    .await
    .unwrap();
    assert_eq!(outcome.label(), "done");
    let sent_before = confirmations_sent(pool).await;

    let mut conn = pool.acquire().await.unwrap();
    let run = replay::dry_run(&services.pool, &TRIAGER, &group(), 500)
        .await
        .unwrap();
    assert_eq!((run.already_applied, run.safe, run.needs_human), (1, 0, 0));
    let detail = detail::show(&mut conn, &TRIAGER, letter_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.triage.verdict, Verdict::AlreadyApplied);
    assert_eq!(detail.triage.referenced[0].entity, "withdrawal");
    assert_eq!(
        detail.triage.referenced[0].state.as_deref(),
        Some("CONFIRMED")
    );
    assert_eq!(detail.body["data"]["withdrawal_id"], id);
    assert_eq!(detail.headers["x-paybus-function"], "confirm-withdrawal");

    let report = act_now(&services, OperationAction::Replay, &group(), "alice").await;
    assert_eq!((report.replayed, report.already_applied), (0, 1));
    assert_eq!(
        confirmations_sent(pool).await,
        sent_before,
        "nothing was sent"
    );
    assert_eq!(debits(pool, id).await, 1);
    let detail = detail::show(&mut conn, &TRIAGER, letter_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        detail.letter.status.as_str(),
        "NEW",
        "left for ops to archive"
    );
    let trail: Vec<_> = detail
        .actions
        .iter()
        .map(|a| {
            (
                a.action.as_str(),
                a.actor.as_str(),
                a.verdict.as_deref(),
                a.result.as_str(),
            )
        })
        .collect();
    assert_eq!(
        trail,
        [("REPLAY", "alice", Some("already_applied"), "NOT_SENT")]
    );
}

#[tokio::test]
async fn a_safe_letter_is_replayed_and_applied_once_and_a_second_replay_of_the_group_applies_nothing()
 {
    let _turn = OutcomeCounts::take().await;
    let (env, services, partner) = setup().await;
    let pool = &services.pool;
    let safe = in_flight(pool, partner, "100").await;
    let never_broadcast = withdrawal(
        pool,
        partner,
        WithdrawalKind::Normal,
        WithdrawalStatus::Requested,
        "7",
    )
    .await;
    dead_letter(pool, "confirm-withdrawal", confirmation(safe)).await;
    dead_letter(pool, "confirm-withdrawal", confirmation(never_broadcast)).await;
    dead_letter(pool, "confirm-withdrawal", confirmation(999_999)).await;
    let mut runner = Runner::new(Services::connect(env.settings.clone()).await.unwrap());
    runner.add_function(ConfirmWithdrawal);
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(runner.run(shutdown.clone()));

    let run = replay::dry_run(&services.pool, &TRIAGER, &group(), 500)
        .await
        .unwrap();
    assert_eq!((run.already_applied, run.safe, run.needs_human), (0, 1, 2));
    let first = act_now(&services, OperationAction::Replay, &group(), "alice").await;
    assert_eq!(
        (first.replayed, first.needs_human, first.already_applied),
        (1, 2, 0)
    );
    assert!(
        eventually(Duration::from_secs(30), || async {
            paybus_confirmations::withdrawal::find(&mut pool.acquire().await.unwrap(), safe)
                .await
                .unwrap()
                .is_some_and(|w| w.status == WithdrawalStatus::Confirmed)
        })
        .await,
        "the replayed confirmation was applied"
    );
    let sent = confirmations_sent(pool).await;

    let second = act_now(&services, OperationAction::Replay, &group(), "alice").await;
    assert_eq!(
        (second.replayed, second.needs_human, second.skipped),
        (0, 2, 0)
    );
    assert_eq!(
        confirmations_sent(pool).await,
        sent,
        "the second replay sent nothing"
    );
    // Room for a (wrong) second application to land before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    consumer.await.unwrap().unwrap();
    assert_eq!(debits(pool, safe).await, 1, "debited once");
    assert_eq!(debits(pool, never_broadcast).await, 0);
    paybus_testkit::confirmations::assert_audit_clean(pool).await;
}

type SumRow = (Option<u64>, String, paybus_money::Amount, u64);

/// (partner, currency, amount, rows) of each sum.
fn sums(list: &[paybus_dead_letter_ops::ExposureSum]) -> Vec<SumRow> {
    list.iter()
        .map(|s| (s.partner_id, s.currency.clone(), s.amount, s.rows))
        .collect()
}

#[tokio::test]
async fn copies_of_one_anomaly_hold_its_money_up_once_and_say_it_needs_a_human() {
    // Seven withdrawals worth 19,036 once showed 57,107 at stake: every copy of a letter
    // counted the withdrawal's amount again.
    let (_env, services, acme) = setup().await;
    let pool = &services.pool;
    let failed = withdrawal(
        pool,
        acme,
        WithdrawalKind::Normal,
        WithdrawalStatus::Failed,
        "19036",
    )
    .await;
    for _ in 0..3 {
        dead_letter(pool, "confirm-withdrawal", confirmation(failed)).await;
    }
    let safe = in_flight(pool, acme, "4").await;
    dead_letter(pool, "confirm-withdrawal", confirmation(safe)).await;

    let overview = groups::overview(&services.pool, &TRIAGER).await.unwrap();
    assert_eq!(overview.groups.len(), 1);
    assert_eq!(overview.groups[0].count, 4);
    assert_eq!(
        sums(&overview.exposure),
        [(Some(acme), "USDT".to_owned(), dec("19040"), 2)]
    );
    let sum = &overview.exposure[0];
    assert_eq!((sum.letters, sum.needs_a_human), (4, dec("19036")));
    assert_eq!(overview.groups[0].exposure, overview.exposure);
}

#[tokio::test]
async fn the_money_at_stake_reads_the_oldest_letters_page_by_page_up_to_its_limit() {
    // 1,001 letters, copies of the confirmations of 300 withdrawals of 1 USDT each: the scan
    // pages through the first 1,000 (several statements' worth), counts every letter, sums
    // each withdrawal once, and says it stopped short of the last one.
    let (_env, services, acme) = setup().await;
    let pool = &services.pool;
    let mut withdrawals = Vec::new();
    for _ in 0..300 {
        withdrawals.push(in_flight(pool, acme, "1").await);
    }
    let limit = usize::try_from(groups::EXPOSURE_SCAN_LIMIT).unwrap();
    for i in 0..=limit {
        dead_letter(
            pool,
            "confirm-withdrawal",
            confirmation(withdrawals[i % 300]),
        )
        .await;
    }
    let overview = groups::overview(pool, &TRIAGER).await.unwrap();
    assert_eq!(overview.groups.len(), 1);
    assert_eq!(overview.groups[0].count, limit as u64 + 1);
    assert!(!overview.exposure_complete);
    assert_eq!(
        sums(&overview.exposure),
        [(Some(acme), "USDT".to_owned(), dec("300"), 300)]
    );
    assert_eq!(overview.exposure[0].letters, limit as u64);
}

#[tokio::test]
async fn groups_sum_the_money_at_stake_per_partner_and_currency_biggest_first() {
    let (_env, services, acme) = setup().await;
    let pool = &services.pool;
    let globex = paybus_testkit::partners::partner(pool, "globex", None).await;
    for amount in ["100", "250.5"] {
        let id = in_flight(pool, acme, amount).await;
        dead_letter(pool, "confirm-withdrawal", confirmation(id)).await;
    }
    // Already applied: holds nothing up.
    let confirmed = withdrawal(
        pool,
        acme,
        WithdrawalKind::Normal,
        WithdrawalStatus::Confirmed,
        "5000",
    )
    .await;
    dead_letter(pool, "confirm-withdrawal", confirmation(confirmed)).await;
    let detected = deposit(pool, globex, "DETECTED", "1000", "1").await;
    dead_letter(
        pool,
        "confirm-deposit",
        DepositTxConfirmed {
            deposit_id: detected,
        },
    )
    .await;
    // Archived: not in the overview.
    let archived = in_flight(pool, globex, "9999").await;
    let archived = dead_letter(pool, "confirm-withdrawal", confirmation(archived)).await;
    let report = act_now(
        &services,
        OperationAction::Archive,
        &Selection::Ids(vec![archived]),
        "alice",
    )
    .await;
    assert_eq!(report.archived, 1);

    let overview = groups::overview(&services.pool, &TRIAGER).await.unwrap();
    let counts: Vec<_> = overview
        .groups
        .iter()
        .map(|g| (g.function.as_str(), g.reason.as_str(), g.count))
        .collect();
    // Biggest money first, not most letters first.
    assert_eq!(
        counts,
        [
            ("confirm-deposit", "failed", 1),
            ("confirm-withdrawal", "failed", 3),
        ]
    );
    assert_eq!(
        sums(&overview.exposure),
        [
            (Some(globex), "USDT".to_owned(), dec("1000"), 1),
            (Some(acme), "USDT".to_owned(), dec("350.5"), 2),
        ]
    );
    assert_eq!(
        sums(&overview.groups[1].exposure),
        [(Some(acme), "USDT".to_owned(), dec("350.5"), 2)]
    );
    assert!(overview.exposure_complete);
    assert!(overview.groups[0].first_failed_at <= overview.groups[0].last_failed_at);
}

#[tokio::test]
async fn a_letter_of_no_catalog_function_or_an_unreadable_body_needs_a_human() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let id = in_flight(pool, partner, "1").await;
    // A confirm-withdrawal letter whose body is a deposit confirmation: not its envelope.
    dead_letter(
        pool,
        "confirm-withdrawal",
        DepositTxConfirmed { deposit_id: id },
    )
    .await;
    dead_letter(pool, "retired-function", confirmation(id)).await;
    for selection in [
        group(),
        Selection::Group {
            function: "retired-function".to_owned(),
            reason: "failed".to_owned(),
        },
    ] {
        let run = replay::dry_run(&services.pool, &TRIAGER, &selection, 500)
            .await
            .unwrap();
        assert_eq!((run.safe, run.needs_human), (0, 1), "{selection:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_webhook_is_redelivered_by_a_replay_under_its_own_id_once_the_breaker_lets_it() {
    let _turn = OutcomeCounts::take().await;
    use paybus_bus::Handler;
    use paybus_deliver_webhook::{DeliverWebhook, WebhookConfig, request::HEADER_NOTIFICATION_ID};
    use paybus_partners::{
        breaker::BreakerPolicy,
        notifications::{NewNotification, enqueue},
    };
    use paybus_retry::RetryPolicy;
    use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

    let env = TestEnv::new().await;
    let services = env.services(&[DeliverWebhook::queue()]).await;
    let endpoint = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&endpoint)
        .await;
    let partner =
        paybus_testkit::partners::partner(&services.pool, "acme", Some(&endpoint.uri())).await;
    let config = WebhookConfig {
        timeout: Duration::from_secs(2),
        retry: RetryPolicy::with_schedule(2, vec![Duration::from_millis(100)]).unwrap(),
        breaker: BreakerPolicy {
            failures_to_open: 2,
            cool_down: Duration::from_secs(2),
        },
        ..WebhookConfig::default()
    };
    let shutdown = CancellationToken::new();
    let mut runner = Runner::new(services.clone());
    runner.add_function(DeliverWebhook::new(config, paybus_testkit::sealer()).unwrap());
    runner.add_job(std::sync::Arc::new(
        paybus_deliver_webhook::due_notifications(
            &services,
            paybus_maintenance::DueSweepConfig {
                interval: Duration::from_millis(50),
                ..Default::default()
            },
        ),
    ));
    let run = tokio::spawn({
        let token = shutdown.clone();
        async move { runner.run(token).await.unwrap() }
    });

    let mut uow = services.outbox.begin().await.unwrap();
    let notification = enqueue(
        &mut uow,
        &NewNotification {
            partner_id: partner,
            event: "WITHDRAWAL_CONFIRMED",
            reference_type: "WITHDRAWAL",
            reference_id: 7,
            payload: &serde_json::json!({"withdrawal_id": 7}),
        },
        uuid::Uuid::new_v4(),
    )
    .await
    .unwrap()
    .unwrap();
    uow.commit().await.unwrap();
    let status = |pool: MySqlPool| async move {
        sqlx::query_scalar::<_, String>("SELECT status FROM partner_notifications WHERE id = ?")
            .bind(notification)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let failed = eventually(Duration::from_secs(30), || async {
        status(services.pool.clone()).await == "FAILED"
            && sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM dead_letters")
                .fetch_one(&services.pool)
                .await
                .unwrap()
                == 1
    })
    .await;
    assert!(failed);

    let selection = Selection::Group {
        function: DeliverWebhook::FUNCTION.to_owned(),
        reason: "failed".to_owned(),
    };
    // The breaker opened on the second failure: the endpoint is still failing.
    let run_now = replay::dry_run(&services.pool, &TRIAGER, &selection, 10)
        .await
        .unwrap();
    assert_eq!(run_now.needs_human, 1, "{:?}", run_now.letters);
    assert!(run_now.letters[0].triage.reason.contains("breaker is open"));

    let refused = endpoint.received_requests().await.unwrap().len();
    assert_eq!(refused, 2);
    // The partner fixes its endpoint (which forgets what it received); the cool-down passes.
    endpoint.reset().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&endpoint)
        .await;
    let safe = eventually(Duration::from_secs(10), || async {
        replay::dry_run(&services.pool, &TRIAGER, &selection, 10)
            .await
            .unwrap()
            .safe
            == 1
    })
    .await;
    assert!(safe);
    let report = act_now(&services, OperationAction::Replay, &selection, "alice").await;
    assert_eq!(report.replayed, 1, "{report:?}");

    let delivered = eventually(Duration::from_secs(30), || async {
        status(services.pool.clone()).await == "DELIVERED"
    })
    .await;
    // Time for a second delivery, had the replay caused one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    run.await.unwrap();
    assert!(delivered);
    let received = endpoint.received_requests().await.unwrap();
    let ids: Vec<&str> = received
        .iter()
        .filter_map(|r| r.headers.get(HEADER_NOTIFICATION_ID))
        .filter_map(|v| v.to_str().ok())
        .collect();
    let expected = notification.to_string();
    assert_eq!(
        ids,
        [expected.as_str()],
        "one POST after the fix, under the same id"
    );
}

/// `count` in-flight withdrawals of `partner`, each with a dead-lettered confirmation (safe to
/// replay); their letter ids.
async fn safe_letters(pool: &MySqlPool, partner: u64, count: usize) -> Vec<u64> {
    let mut letters = Vec::with_capacity(count);
    for n in 0..count {
        let id = in_flight(pool, partner, &format!("{}", 10 + n)).await;
        letters.push(dead_letter(pool, "confirm-withdrawal", confirmation(id)).await);
    }
    letters
}

async fn letter_status(pool: &MySqlPool, id: u64) -> String {
    sqlx::query_scalar("SELECT status FROM dead_letters WHERE id = ?")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn replay_actions(pool: &MySqlPool, id: u64) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM dead_letter_actions WHERE dead_letter_id = ? AND result = 'REPLAYED'",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn requested(
    services: &Services,
    action: OperationAction,
    actor: &str,
    policy: &Policy,
) -> paybus_dead_letter_ops::OperationDetail {
    operation::request(
        &services.pool,
        &TRIAGER,
        action,
        &group(),
        &paybus_testkit::person(actor),
        500,
        policy,
    )
    .await
    .unwrap()
}

async fn execute_as(
    services: &Services,
    id: uuid::Uuid,
    actor: &str,
) -> Result<ExecutionReport, DeadLetterError> {
    operation::execute(
        &services.outbox,
        &TRIAGER,
        id,
        &paybus_testkit::person(actor),
        fast(),
        |_| {},
    )
    .await
}

/// A confirmation of an in-flight withdrawal of `partner`, as it would be dead-lettered again
/// and again: its letter key and message.
async fn failing_confirmation(pool: &MySqlPool, partner: u64) -> (String, OutgoingMessage) {
    let id = in_flight(pool, partner, "25").await;
    let message = Envelope::new(confirmation(id)).to_outgoing().unwrap();
    (format!("confirm-withdrawal:{}", message.id), message)
}

/// One failure of `message` under letter `key`, in a transaction of its own.
async fn fail(pool: &MySqlPool, key: &str, message: &OutgoingMessage) {
    let mut tx = pool.begin().await.unwrap();
    assert!(
        record_given_up(&mut tx, "confirm-withdrawal", key, message, "boom", 4)
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
}

/// `action` on the one letter recorded under `key`, by alice, at once.
async fn act_on_letter(services: &Services, action: OperationAction, key: &str) -> ExecutionReport {
    let id = letter_id(&services.pool, key).await;
    act_now(services, action, &Selection::Ids(vec![id]), "alice").await
}

async fn letter_id(pool: &MySqlPool, key: &str) -> u64 {
    sqlx::query_scalar("SELECT id FROM dead_letters WHERE dead_letter_id = ?")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// (function, reason, letters, failures) of every group.
type Counts = Vec<(String, String, i64, i64)>;

/// The NEW letters counted one by one, now: what the kept counts must equal.
async fn counted_afresh(pool: &MySqlPool) -> Counts {
    sqlx::query_as(
        "SELECT function_name, reason, COUNT(*), CAST(SUM(failures) AS SIGNED) \
         FROM dead_letters WHERE status = 'NEW' GROUP BY function_name, reason \
         ORDER BY function_name, reason",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// What the groups page shows.
async fn shown(pool: &MySqlPool) -> Counts {
    let mut shown: Counts = groups::overview(pool, &TRIAGER)
        .await
        .unwrap()
        .groups
        .into_iter()
        .map(|g| {
            (
                g.function,
                g.reason,
                i64::try_from(g.count).unwrap(),
                i64::try_from(g.failures).unwrap(),
            )
        })
        .collect();
    shown.sort();
    shown
}

fn withdrawals_failed(letters: i64, failures: i64) -> Counts {
    if letters == 0 {
        return Vec::new();
    }
    vec![(
        "confirm-withdrawal".to_owned(),
        "failed".to_owned(),
        letters,
        failures,
    )]
}

/// The group-count findings of the audit, run as `paybus audit` runs it (one snapshot).
async fn drift_found(pool: &MySqlPool) -> Vec<String> {
    let checks = paybus_catalog::audit_checks();
    let check = checks
        .iter()
        .find(|check| check.name == "dead_letter_group_counts")
        .copied()
        .expect("the catalog's audit has the group-count check");
    let mut tx = pool.begin().await.unwrap();
    let violations = audit::run(&mut tx, &[check]).await.unwrap();
    tx.commit().await.unwrap();
    violations.into_iter().map(|v| v.description).collect()
}

#[tokio::test]
async fn a_groups_counts_follow_its_letters_through_repeats_an_archive_a_reopening_and_a_replay() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let (first, first_message) = failing_confirmation(pool, partner).await;
    let (second, second_message) = failing_confirmation(pool, partner).await;

    fail(pool, &first, &first_message).await;
    assert_eq!(shown(pool).await, withdrawals_failed(1, 1));
    fail(pool, &first, &first_message).await;
    assert_eq!(shown(pool).await, withdrawals_failed(1, 2), "failed again");
    fail(pool, &second, &second_message).await;
    assert_eq!(shown(pool).await, withdrawals_failed(2, 3));

    let archived = act_on_letter(&services, OperationAction::Archive, &first).await;
    assert_eq!(archived.archived, 1);
    assert_eq!(shown(pool).await, withdrawals_failed(1, 1), "archived");

    fail(pool, &first, &first_message).await;
    assert_eq!(
        shown(pool).await,
        withdrawals_failed(2, 4),
        "reopened with its three failures"
    );

    let replayed = act_on_letter(&services, OperationAction::Replay, &second).await;
    assert_eq!(replayed.replayed, 1);
    assert_eq!(shown(pool).await, withdrawals_failed(1, 3), "replayed");
    assert_eq!(shown(pool).await, counted_afresh(pool).await);
    assert_eq!(drift_found(pool).await, Vec::<String>::new());
}

/// The group's first and last failure as shown, and as read afresh from its NEW letters.
async fn failure_times_shown_and_afresh(
    pool: &MySqlPool,
) -> (
    Option<(DateTime<Utc>, DateTime<Utc>)>,
    Option<(DateTime<Utc>, DateTime<Utc>)>,
) {
    let shown = groups::overview(pool, &TRIAGER)
        .await
        .unwrap()
        .groups
        .into_iter()
        .find(|g| g.function == "confirm-withdrawal")
        .map(|g| (g.first_failed_at, g.last_failed_at));
    let afresh: (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT MIN(failed_at), GREATEST(MAX(failed_at), COALESCE(MAX(last_failed_at), MAX(failed_at))) \
         FROM dead_letters IGNORE INDEX (index_dead_letters_groups_first_failure, \
                                         index_dead_letters_groups_last_failure) \
         WHERE function_name = 'confirm-withdrawal' AND status = 'NEW'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (shown, afresh.0.zip(afresh.1))
}

#[tokio::test]
async fn a_groups_first_and_last_failure_are_its_new_letters_through_a_repeat_an_archive_and_a_replay()
 {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let (first, first_message) = failing_confirmation(pool, partner).await;
    let (second, second_message) = failing_confirmation(pool, partner).await;

    fail(pool, &first, &first_message).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    fail(pool, &second, &second_message).await;
    let (shown, afresh) = failure_times_shown_and_afresh(pool).await;
    assert_eq!(shown, afresh);
    let (first_failure, second_failure) = shown.unwrap();
    assert!(first_failure < second_failure, "two letters, apart in time");

    tokio::time::sleep(Duration::from_millis(20)).await;
    fail(pool, &first, &first_message).await;
    let (shown, afresh) = failure_times_shown_and_afresh(pool).await;
    assert_eq!(shown, afresh);
    let (still_first, repeated) = shown.unwrap();
    assert_eq!(
        still_first, first_failure,
        "a repeat keeps its letter's first failure"
    );
    assert!(
        repeated > second_failure,
        "the repeat is the group's last failure"
    );

    let archived = act_on_letter(&services, OperationAction::Archive, &first).await;
    assert_eq!(archived.archived, 1);
    let (shown, afresh) = failure_times_shown_and_afresh(pool).await;
    assert_eq!(shown, afresh);
    assert_eq!(
        shown,
        Some((second_failure, second_failure)),
        "the archived letter's times leave the group"
    );

    let replayed = act_on_letter(&services, OperationAction::Replay, &second).await;
    assert_eq!(replayed.replayed, 1);
    assert_eq!(
        failure_times_shown_and_afresh(pool).await,
        (None, None),
        "no NEW letter, no group"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_groups_counts_stay_exact_under_concurrent_recordings_replays_and_archives() {
    const LETTERS: usize = 24;
    const RECORDERS: usize = 4;
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let mut letters = Vec::with_capacity(LETTERS);
    for _ in 0..LETTERS {
        let (key, message) = failing_confirmation(pool, partner).await;
        fail(pool, &key, &message).await;
        letters.push((key, message));
    }
    let letters = std::sync::Arc::new(letters);
    let mut ids = Vec::with_capacity(LETTERS);
    for (key, _) in letters.iter() {
        ids.push(letter_id(pool, key).await);
    }
    let (to_replay, to_archive) = ids.split_at(LETTERS / 2);
    let mut operations = Vec::new();
    for (action, ids) in [
        (OperationAction::Replay, to_replay),
        (OperationAction::Archive, to_archive),
    ] {
        let requested = operation::request(
            pool,
            &TRIAGER,
            action,
            &Selection::Ids(ids.to_vec()),
            &paybus_testkit::person("alice"),
            500,
            &Policy::off(),
        )
        .await
        .unwrap();
        operations.push(requested.operation.id);
    }

    // Each on connections of its own: the replay and the archive letter by letter, and
    // recorders failing the same letters again (some while they are being replayed or
    // archived, some after: reopened) and new letters of the group, until both are done.
    let done = CancellationToken::new();
    let acting: Vec<_> = operations
        .into_iter()
        .map(|id| {
            let services = services.clone();
            tokio::spawn(async move { execute_as(&services, id, "alice").await.unwrap() })
        })
        .collect();
    let recorders: Vec<_> = (0..RECORDERS)
        .map(|recorder| {
            let (pool, letters, done) = (pool.clone(), letters.clone(), done.clone());
            tokio::spawn(async move {
                let mut round = 0;
                loop {
                    let finished = done.is_cancelled();
                    for (n, (key, message)) in letters.iter().enumerate() {
                        if n % RECORDERS == recorder {
                            fail(&pool, key, message).await;
                        }
                    }
                    let fresh = Envelope::new(confirmation(1_000_000 + round))
                        .to_outgoing()
                        .unwrap();
                    fail(&pool, &format!("confirm-withdrawal:{}", fresh.id), &fresh).await;
                    round += 1;
                    if finished {
                        return round;
                    }
                }
            })
        })
        .collect();
    let mut acted = (0, 0);
    for execution in acting {
        let report = execution.await.unwrap();
        acted.0 += report.replayed;
        acted.1 += report.archived;
    }
    done.cancel();
    let mut rounds = 0;
    for recorder in recorders {
        rounds += recorder.await.unwrap();
    }

    assert!(
        acted.0 > 0 && acted.1 > 0,
        "replayed and archived: {acted:?}"
    );
    let reopened: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM dead_letters WHERE reopened_at IS NOT NULL")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(reopened > 0, "some letters were reopened ({rounds} rounds)");
    let afresh = counted_afresh(pool).await;
    assert_eq!(shown(pool).await, afresh);
    assert_eq!(drift_found(pool).await, Vec::<String>::new());
}

#[tokio::test]
async fn the_audit_finds_group_counts_that_drifted_and_a_recount_sets_them_right() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    for _ in 0..3 {
        let (key, message) = failing_confirmation(pool, partner).await;
        fail(pool, &key, &message).await;
    }
    let bonus = Envelope::new(confirmation(7)).to_outgoing().unwrap();
    let mut conn = pool.acquire().await.unwrap();
    record_given_up(
        &mut conn,
        "grant-bonus",
        "grant-bonus:drift",
        &bonus,
        "boom",
        4,
    )
    .await
    .unwrap();
    drop(conn);
    assert_eq!(drift_found(pool).await, Vec::<String>::new());

    // Counts changed by hand, one group's forgotten, and a letter written around the
    // recorder (SQL by hand, or a paybus from before the counts during a deploy).
    sqlx::query(
        "UPDATE dead_letter_group_counts SET letters = letters + 1 \
         WHERE function_name = 'confirm-withdrawal' LIMIT 1",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM dead_letter_group_counts WHERE function_name = 'grant-bonus'")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO dead_letters (dead_letter_id, function_name, routing_key, reason, error, \
         body) VALUES ('by-hand', 'deliver-webhook', 'k', 'failed', 'e', '{}')",
    )
    .execute(pool)
    .await
    .unwrap();

    let found = drift_found(pool).await;
    assert_eq!(found.len(), 3, "{found:#?}");
    for group in [
        "confirm-withdrawal / failed is counted as 4 letter(s) and 3 failure(s), its NEW letters are 3",
        "deliver-webhook / failed is counted as 0 letter(s) and 0 failure(s), its NEW letters are 1",
        "grant-bonus / failed is counted as 0 letter(s) and 0 failure(s), its NEW letters are 1",
    ] {
        assert!(
            found.iter().any(|finding| finding.contains(group)),
            "{group}: {found:#?}"
        );
    }

    let corrected = group_counts::recount(pool).await.unwrap();
    assert_eq!(corrected.len(), 3, "{corrected:#?}");
    assert_eq!(drift_found(pool).await, Vec::<String>::new());
    assert_eq!(shown(pool).await, counted_afresh(pool).await);
    assert!(group_counts::recount(pool).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recount_while_letters_are_recorded_and_archived_leaves_the_counts_exact() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let mut letters = Vec::new();
    for _ in 0..12 {
        let (key, message) = failing_confirmation(pool, partner).await;
        fail(pool, &key, &message).await;
        letters.push(letter_id(pool, &key).await);
    }
    sqlx::query("UPDATE dead_letter_group_counts SET letters = letters + 5")
        .execute(pool)
        .await
        .unwrap();

    let archive = operation::request(
        pool,
        &TRIAGER,
        OperationAction::Archive,
        &Selection::Ids(letters),
        &paybus_testkit::person("alice"),
        500,
        &Policy::off(),
    )
    .await
    .unwrap()
    .operation
    .id;
    let archiving = {
        let services = services.clone();
        tokio::spawn(async move { execute_as(&services, archive, "alice").await.unwrap() })
    };
    let recording: Vec<_> = (0..3)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for n in 0..30 {
                    let message = Envelope::new(confirmation(2_000_000 + n))
                        .to_outgoing()
                        .unwrap();
                    fail(
                        &pool,
                        &format!("confirm-withdrawal:{}", message.id),
                        &message,
                    )
                    .await;
                }
            })
        })
        .collect();
    // Recounts while they write, then none: a change a recount lost or counted twice would
    // stay wrong to the end instead of being set right by a recount after the writers.
    let mut recounts = 0;
    while recounts < 10 && recording.iter().any(|task| !task.is_finished()) {
        group_counts::recount(pool).await.unwrap();
        recounts += 1;
    }
    let written_after = recording.iter().any(|task| !task.is_finished());
    assert_eq!(archiving.await.unwrap().archived, 12);
    for task in recording {
        task.await.unwrap();
    }

    assert!(
        recounts == 10 && written_after,
        "recounted while they wrote ({recounts}), and they wrote on after"
    );
    assert_eq!(drift_found(pool).await, Vec::<String>::new());
    assert_eq!(shown(pool).await, withdrawals_failed(90, 90));
}

#[tokio::test]
async fn a_letter_arriving_between_the_dry_run_and_the_replay_of_its_group_is_untouched() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let previewed = safe_letters(pool, partner, 2).await;
    let operation = requested(&services, OperationAction::Replay, "alice", &Policy::off()).await;
    assert_eq!((operation.operation.letters, operation.safe), (2, 2));
    // It arrives after the dry run, in the same group.
    let late = safe_letters(pool, partner, 1).await[0];

    let report = execute_as(&services, operation.operation.id, "alice")
        .await
        .unwrap();
    assert_eq!((report.replayed, report.remaining), (2, 0));
    assert_eq!(report.operation.status, OperationStatus::Done);
    for letter in &previewed {
        assert_eq!(letter_status(pool, *letter).await, "REPLAYED");
    }
    assert_eq!(
        letter_status(pool, late).await,
        "NEW",
        "not previewed, not acted on"
    );
    assert_eq!(replay_actions(pool, late).await, 0);
    assert_eq!(confirmations_sent(pool).await, 2);
}

#[tokio::test]
async fn one_operation_executed_concurrently_and_then_again_replays_each_letter_once() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let letters = safe_letters(pool, partner, 8).await;
    let operation = requested(&services, OperationAction::Replay, "alice", &Policy::off()).await;
    let id = operation.operation.id;

    // Three executions at once, each on its own connections (real concurrent transactions).
    let runs: Vec<_> = ["alice", "bob", "carol"]
        .into_iter()
        .map(|actor| {
            let services = services.clone();
            tokio::spawn(async move { execute_as(&services, id, actor).await.unwrap() })
        })
        .collect();
    let mut replayed = 0;
    for run in runs {
        replayed += run.await.unwrap().replayed;
    }
    let again = execute_as(&services, id, "dave").await.unwrap();

    assert_eq!(
        replayed, 8,
        "the concurrent executions replayed each letter once in all"
    );
    assert_eq!(
        (again.replayed, again.remaining, again.results.len()),
        (0, 0, 0)
    );
    assert_eq!(again.operation.status, OperationStatus::Done);
    assert_eq!(again.operation.done, 8);
    assert_eq!(confirmations_sent(pool).await, 8);
    for letter in &letters {
        assert_eq!(replay_actions(pool, *letter).await, 1, "letter {letter}");
    }
}

#[tokio::test]
async fn four_eyes_a_replay_runs_only_after_another_person_approved_the_hash_they_saw() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    let letters = safe_letters(pool, partner, 2).await;
    let operation = requested(
        &services,
        OperationAction::Replay,
        "alice",
        &Policy::default(),
    )
    .await
    .operation;
    assert_eq!(operation.status, OperationStatus::AwaitingApproval);
    assert!(operation.approval_required);

    let not_yet = execute_as(&services, operation.id, "alice").await;
    assert!(
        matches!(not_yet, Err(DeadLetterError::OperationState { .. })),
        "{not_yet:?}"
    );
    let mut conn = pool.acquire().await.unwrap();
    let own = operation::approve(
        &mut conn,
        operation.id,
        &paybus_testkit::person("alice"),
        &operation.content_hash,
    )
    .await;
    assert!(
        matches!(own, Err(DeadLetterError::SelfApproval(_))),
        "{own:?}"
    );
    let wrong = operation::approve(
        &mut conn,
        operation.id,
        &paybus_testkit::person("bob"),
        &"0".repeat(64),
    )
    .await;
    assert!(
        matches!(wrong, Err(DeadLetterError::OperationState { .. })),
        "{wrong:?}"
    );
    assert_eq!(
        confirmations_sent(pool).await,
        0,
        "nothing ran before the approval"
    );

    let approved = operation::approve(
        &mut conn,
        operation.id,
        &paybus_testkit::person("bob"),
        &operation.content_hash,
    )
    .await
    .unwrap();
    assert_eq!(
        (approved.status, approved.approved_by.as_deref()),
        (OperationStatus::Ready, Some("bob"))
    );
    let twice = operation::approve(
        &mut conn,
        operation.id,
        &paybus_testkit::person("carol"),
        &operation.content_hash,
    )
    .await;
    assert!(
        matches!(twice, Err(DeadLetterError::OperationState { .. })),
        "{twice:?}"
    );
    let report = execute_as(&services, operation.id, "alice").await.unwrap();
    assert_eq!(report.replayed, 2);
    assert_eq!(confirmations_sent(pool).await, 2);
    for letter in &letters {
        assert_eq!(replay_actions(pool, *letter).await, 1);
    }
    // The ops log holds the request, the approval and each replay, chained.
    let logged: Vec<(String, String, String)> =
        sqlx::query_as("SELECT action, actor, subject FROM ops_log ORDER BY seq")
            .fetch_all(pool)
            .await
            .unwrap();
    let subject = format!("dead_letter_operation:{}", operation.id);
    assert_eq!(
        logged,
        [
            (
                "dead_letter_operation.request".to_owned(),
                "alice".to_owned(),
                subject.clone()
            ),
            (
                "dead_letter_operation.approve".to_owned(),
                "bob".to_owned(),
                subject
            ),
            (
                "dead_letter.replay".to_owned(),
                "alice".to_owned(),
                format!("dead_letter:{}", letters[0])
            ),
            (
                "dead_letter.replay".to_owned(),
                "alice".to_owned(),
                format!("dead_letter:{}", letters[1])
            ),
        ]
    );
    let mut conn = pool.acquire().await.unwrap();
    assert!(
        paybus_ops::ops_log::verify(&mut conn)
            .await
            .unwrap()
            .is_empty(),
        "the chain holds"
    );
}

#[tokio::test]
async fn an_expired_operation_can_be_neither_approved_nor_started() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    safe_letters(pool, partner, 1).await;
    let awaiting = requested(
        &services,
        OperationAction::Replay,
        "alice",
        &Policy::default(),
    )
    .await
    .operation;
    let ready = requested(&services, OperationAction::Replay, "alice", &Policy::off())
        .await
        .operation;
    sqlx::query("UPDATE dead_letter_operations SET expires_at = NOW(6) - INTERVAL 1 SECOND")
        .execute(pool)
        .await
        .unwrap();

    let mut conn = pool.acquire().await.unwrap();
    let approval = operation::approve(
        &mut conn,
        awaiting.id,
        &paybus_testkit::person("bob"),
        &awaiting.content_hash,
    )
    .await;
    assert!(
        matches!(&approval, Err(DeadLetterError::OperationState { problem, .. }) if problem.contains("expired")),
        "{approval:?}"
    );
    let start = execute_as(&services, ready.id, "alice").await;
    assert!(
        matches!(&start, Err(DeadLetterError::OperationState { problem, .. }) if problem.contains("expired")),
        "{start:?}"
    );
    let shown = operation::show(&mut conn, ready.id).await.unwrap().unwrap();
    assert!(shown.operation.expired);
    assert_eq!(confirmations_sent(pool).await, 0);
}

#[tokio::test]
async fn an_operation_whose_letters_were_changed_after_the_approval_does_not_run() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    safe_letters(pool, partner, 1).await;
    dead_letter(pool, "confirm-withdrawal", confirmation(999_999)).await;
    let operation = requested(
        &services,
        OperationAction::Replay,
        "alice",
        &Policy::default(),
    )
    .await
    .operation;
    let mut conn = pool.acquire().await.unwrap();
    operation::approve(
        &mut conn,
        operation.id,
        &paybus_testkit::person("bob"),
        &operation.content_hash,
    )
    .await
    .unwrap();
    // Someone with database access turns the letter that needs a human into a "safe" one.
    let changed = sqlx::query(
        "UPDATE dead_letter_operation_letters SET verdict = 'safe' \
         WHERE operation_id = ? AND verdict = 'needs_human'",
    )
    .bind(operation.id.to_string())
    .execute(pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(changed, 1);

    let refused = execute_as(&services, operation.id, "alice").await;
    assert!(
        matches!(refused, Err(DeadLetterError::OperationTampered(_))),
        "{refused:?}"
    );
    assert_eq!(confirmations_sent(pool).await, 0);
}

#[tokio::test]
async fn an_archive_needs_a_second_person_only_when_a_letter_has_money_at_stake() {
    let (_env, services, partner) = setup().await;
    let pool = &services.pool;
    // A confirmation of an unknown withdrawal holds no money up.
    dead_letter(pool, "confirm-withdrawal", confirmation(999_999)).await;
    let without_money = requested(
        &services,
        OperationAction::Archive,
        "alice",
        &Policy::default(),
    )
    .await;
    assert_eq!(without_money.operation.letters_with_money, 0);
    assert_eq!(without_money.operation.status, OperationStatus::Ready);
    execute_as(&services, without_money.operation.id, "alice")
        .await
        .unwrap();

    safe_letters(pool, partner, 1).await;
    let with_money = requested(
        &services,
        OperationAction::Archive,
        "alice",
        &Policy::default(),
    )
    .await;
    assert_eq!(with_money.operation.letters_with_money, 1);
    assert_eq!(
        with_money.operation.status,
        OperationStatus::AwaitingApproval
    );
}

#[tokio::test]
async fn the_trace_of_a_withdrawal_confirmed_through_duplicates_shows_one_transition_one_debit_and_its_dead_letter()
 {
    let _turn = OutcomeCounts::take().await;
    let (env, services, partner) = setup().await;
    let pool = &services.pool;
    let id = in_flight(pool, partner, "250").await;
    let mut runner = Runner::new(Services::connect(env.settings.clone()).await.unwrap());
    runner.add_function(ConfirmWithdrawal);
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(runner.run(shutdown.clone()));
    // The chain monitor's confirmation and two re-sends of it, through the broker.
    for _ in 0..3 {
        let mut uow = services.outbox.begin().await.unwrap();
        uow.send(&Envelope::new(confirmation(id))).await.unwrap();
        uow.commit().await.unwrap();
    }
    let skipped = eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM skipped_deliveries")
            .fetch_one(pool)
            .await
            .unwrap()
            == 2
    })
    .await;
    shutdown.cancel();
    consumer.await.unwrap().unwrap();
    assert!(skipped, "two duplicates skipped and recorded");
    // A confirmation naming another tx for it: a dead letter about the same withdrawal.
    let letter = dead_letter(
        pool,
        "confirm-withdrawal",
        WithdrawalTxConfirmed {
            withdrawal_id: id,
            tx_hash: "0xother".to_owned(),
        },
    )
    .await;
    let archived = act_now(
        &services,
        OperationAction::Archive,
        &Selection::Ids(vec![letter]),
        "alice",
    )
    .await;
    assert_eq!(archived.archived, 1);

    let mut conn = pool.acquire().await.unwrap();
    let trace = paybus_api::trace::trace(&mut conn, paybus_api::trace::Traced::Withdrawal, id)
        .await
        .unwrap()
        .unwrap();
    let of = |source: &str| {
        trace
            .events
            .iter()
            .filter(|e| e.source == source)
            .map(|e| e.what.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(trace.row["status"], "CONFIRMED");
    assert_eq!(of("history"), ["BROADCASTING → CONFIRMED"], "{trace:#?}");
    assert_eq!(of("ledger"), ["DEBIT 250 USDT"], "{trace:#?}");
    assert_eq!(
        of("notification").len(),
        1,
        "one webhook written: {trace:#?}"
    );
    assert_eq!(of("dead_letter").len(), 1, "{trace:#?}");
    assert_eq!(
        of("dead_letter_action"),
        [format!(
            "ARCHIVE of dead letter {letter} by alice: ARCHIVED"
        )]
    );
    assert_eq!(
        of("ops_log"),
        [format!(
            "dead_letter.archive on dead_letter:{letter} by alice"
        )]
    );
    let skips = of("skipped_delivery");
    assert_eq!(skips.len(), 2, "{trace:#?}");
    assert!(
        skips
            .iter()
            .all(|s| s.contains("confirm-withdrawal skipped")),
        "{skips:?}"
    );
    let times: Vec<_> = trace.events.iter().map(|e| e.at).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");
}
