//! match-deposit's dead-letter triage against real rows: what a replay of
//! `p2p.deposit_order.created` would do, for each state the order can be in now.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_bus::Envelope;
use paybus_match_deposit::MatchDeposit;
use paybus_ops::triage::{Triage, Verdict};
use paybus_p2p::{DepositOrderCreated, Inserted, config::DEFAULT_ORDER_TTL, deposit_order};
use paybus_retry::Clock;
use paybus_runtime::function::FunctionEntry;
use paybus_testkit::{TestEnv, dec, p2p};
use sqlx::MySqlPool;

const ENTRY: FunctionEntry = FunctionEntry::of::<MatchDeposit>();

/// A PENDING order of 100 USDT, due now, as the API creates it.
async fn pending_order(pool: &MySqlPool, partner: u64) -> u64 {
    let mut conn = pool.acquire().await.unwrap();
    match deposit_order::insert(
        &mut conn,
        &p2p::buyer(partner, "100"),
        DEFAULT_ORDER_TTL,
        &Clock::Database,
        deposit_order::Start::Pending,
    )
    .await
    .unwrap()
    {
        Inserted::New(id) => id,
        Inserted::Existing(id) => panic!("order {id} already existed"),
    }
}

async fn set(pool: &MySqlPool, id: u64, assignments: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE p2p_deposit_orders SET {assignments} WHERE id = ?"
    )))
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

/// The triage of a dead letter carrying `p2p.deposit_order.created {id}`, as the dead-letter
/// tools ask for it (the catalog entry, over the letter's raw body).
async fn triage_of(pool: &MySqlPool, id: u64) -> Triage {
    let body = Envelope::new(DepositOrderCreated {
        deposit_order_id: id,
    })
    .to_outgoing()
    .unwrap()
    .body;
    let mut conn = pool.acquire().await.unwrap();
    ENTRY.triage(&mut conn, &body).await.unwrap()
}

async fn setup() -> (TestEnv, u64) {
    let env = TestEnv::new().await;
    let partner = p2p::partner(&env.db, "buyer partner").await;
    (env, partner)
}

#[tokio::test]
async fn a_due_pending_order_is_safe_to_replay_and_exposes_what_it_still_waits_for() {
    let (env, partner) = setup().await;
    let id = pending_order(&env.db, partner).await;

    let triage = triage_of(&env.db, id).await;

    assert_eq!(triage.verdict, Verdict::Safe, "{}", triage.reason);
    assert_eq!(triage.referenced[0].entity, "p2p_deposit_order");
    assert_eq!(triage.referenced[0].state.as_deref(), Some("PENDING"));
    let exposure = triage.exposure.unwrap();
    assert_eq!(
        (
            exposure.partner_id,
            exposure.currency.as_str(),
            exposure.amount
        ),
        (Some(partner), p2p::CURRENCY, dec("100"))
    );
}

#[tokio::test]
async fn an_order_cancelled_at_the_attempt_limit_is_already_applied() {
    let (env, partner) = setup().await;
    let id = pending_order(&env.db, partner).await;
    set(
        &env.db,
        id,
        "status = 'CANCELLED', close_reason = 'MATCH_FAILED', closed_at = NOW(6), \
         match_attempt_count = 5",
    )
    .await;

    let triage = triage_of(&env.db, id).await;

    assert_eq!(triage.verdict, Verdict::AlreadyApplied, "{}", triage.reason);
    assert!(triage.reason.contains("MATCH_FAILED"), "{}", triage.reason);
}

#[tokio::test]
async fn matched_and_expired_orders_are_already_applied() {
    let (env, partner) = setup().await;
    let matched = pending_order(&env.db, partner).await;
    set(
        &env.db,
        matched,
        "status = 'MATCHED', remaining_amount = 0, close_reason = 'FILLED', closed_at = NOW(6)",
    )
    .await;
    let expired = pending_order(&env.db, partner).await;
    set(
        &env.db,
        expired,
        "status = 'EXPIRED', close_reason = 'EXPIRED', closed_at = NOW(6)",
    )
    .await;

    assert_eq!(
        triage_of(&env.db, matched).await.verdict,
        Verdict::AlreadyApplied
    );
    assert_eq!(
        triage_of(&env.db, expired).await.verdict,
        Verdict::AlreadyApplied
    );
}

#[tokio::test]
async fn an_order_in_its_backoff_or_held_by_an_attempt_needs_a_human() {
    let (env, partner) = setup().await;
    let waiting = pending_order(&env.db, partner).await;
    set(
        &env.db,
        waiting,
        "match_attempt_count = 1, next_attempt_at = NOW(6) + INTERVAL 1 HOUR",
    )
    .await;
    let held = pending_order(&env.db, partner).await;
    set(&env.db, held, "status = 'MATCHING', claimed_at = NOW(6)").await;

    let waiting = triage_of(&env.db, waiting).await;
    let held = triage_of(&env.db, held).await;

    assert_eq!(waiting.verdict, Verdict::NeedsHuman);
    assert!(waiting.reason.contains("backoff"), "{}", waiting.reason);
    assert_eq!(held.verdict, Verdict::NeedsHuman);
    assert!(held.reason.contains("MATCHING"), "{}", held.reason);
}

#[tokio::test]
async fn a_letter_for_an_order_that_does_not_exist_needs_a_human() {
    let (env, _) = setup().await;

    let triage = triage_of(&env.db, 424_242).await;

    assert_eq!(triage.verdict, Verdict::NeedsHuman);
    assert_eq!(triage.referenced[0].state, None);
    assert_eq!(triage.exposure, None);
}

#[test]
fn the_deposit_orders_are_registered_as_its_work_table() {
    let tables: Vec<&str> = ENTRY.work_tables.iter().map(|t| t.table).collect();
    assert_eq!(tables, ["p2p_deposit_orders"]);
}
