//! The real `grant-bonus` binary as AWS Lambda runs it: an Amazon MQ batch with a duplicate
//! and malformed messages through a local Runtime API, twice (Amazon MQ's replay); and a
//! broker that is away while the environment starts.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

mod support;

use paybus_bonuses::{BonusJobCreated, BonusRules, charge::Container, job::JobStatus};
use paybus_bus::{Envelope, Handler, Message};
use paybus_grant_bonus::GrantBonus;
use paybus_testkit::{
    bonuses as testing,
    lambda::{LambdaProcess, MqEvent, RuntimeApi},
    outage::Relay,
    queue_depth,
};
use serde_json::json;
use support::*;

const NO_FIRST_CHARGE: BonusRules = BonusRules {
    first_charge_percent: 0,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_duplicate_and_malformed_messages_grants_each_bonus_once() {
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let first = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let second = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job = |charge: &paybus_bonuses::completion::CompletedCharge| {
        Envelope::new(BonusJobCreated {
            job_id: charge.bonus_jobs[0].job_id,
        })
    };
    let event = MqEvent::new("paybus.grant-bonus")
        .envelope(&job(&first))
        .envelope(&job(&second))
        .repeat_last()
        .raw("not-base64", "%%% not base64 %%%")
        .message(
            json!({"messageId": "not-an-envelope", "type": BonusJobCreated::TYPE}),
            b"hello",
        );
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(
        env!("CARGO_BIN_EXE_grant-bonus"),
        &api,
        bonuses.env.env_vars(),
    );

    let answer = lambda.invoke(&mut api, event.json()).await.response();
    let replay = lambda.invoke(&mut api, event.json()).await.response();

    let summary = json!({"processed": 5, "acked": 3, "dead_lettered": 2});
    assert_eq!(answer, summary);
    assert_eq!(replay, summary);
    for charge in [&first, &second] {
        let job = bonuses.job(charge.bonus_jobs[0].job_id).await;
        assert_eq!((job.status, job.retry_count), (JobStatus::Done, 0));
        assert_eq!(
            testing::cans(bonuses.pool(), charge.member_id, Container::Pg).await,
            110,
            "member {}: the payment and its bonus, once",
            charge.member_id
        );
    }
    assert_eq!(
        bonuses
            .count("SELECT COUNT(*) FROM charges WHERE status = 'EVENT'")
            .await,
        2,
        "one EVENT charge per job"
    );
    let channel = bonuses
        .services
        .connection()
        .create_channel()
        .await
        .unwrap();
    assert_eq!(
        queue_depth(&channel, &GrantBonus::queue().dead_letter_queue()).await,
        4,
        "each malformed message dead-lettered by each run (the recorder keeps one row per id)"
    );
    testing::assert_audit_clean(bonuses.pool()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_at_start_fails_the_invocation_untouched_and_the_next_one_grants_once() {
    // The init does not wait for the broker (it connects in the background): the first
    // invocation waits for it, and with the broker away it fails before touching a message.
    let bonuses = Bonuses::new().await;
    ten_percent_event(bonuses.pool()).await;
    let charge = bonuses.completed_purchase(100, NO_FIRST_CHARGE).await;
    let job_id = charge.bonus_jobs[0].job_id;
    let event =
        MqEvent::new("paybus.grant-bonus").envelope(&Envelope::new(BonusJobCreated { job_id }));
    let broker = Relay::to(&bonuses.env.settings.broker.url).await;
    broker.cut();
    let mut vars = bonuses.env.env_vars();
    vars.insert(
        "PAYBUS_AMQP_URL".to_owned(),
        broker.url(&bonuses.env.settings.broker.url).to_string(),
    );
    let mut api = RuntimeApi::start().await;
    let mut lambda = LambdaProcess::spawn(env!("CARGO_BIN_EXE_grant-bonus"), &api, vars);
    api.next_call(std::time::Duration::from_secs(30)).await;

    let failed = lambda.invoke(&mut api, event.json()).await.error();
    let untouched = bonuses.job(job_id).await;
    broker.restore().await;
    let granted = lambda.invoke(&mut api, event.json()).await.response();

    assert_eq!(failed["errorType"], "paybus.StartupError", "{failed}");
    assert!(
        failed["errorMessage"]
            .as_str()
            .is_some_and(|m| m.contains("broker")),
        "{failed}"
    );
    assert_eq!(
        (untouched.status, untouched.retry_count),
        (JobStatus::Pending, 0),
        "no message was looked at"
    );
    assert_eq!(
        granted,
        json!({"processed": 1, "acked": 1, "dead_lettered": 0})
    );
    bonuses.assert_granted_once(charge.member_id, 110).await;
}
