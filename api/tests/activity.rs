//! `GET /v1/admin/activity`: what the functions did, as the console draws it. Withdrawals made
//! through the admin API and confirmed through the chain monitor's intake (some twice), and a
//! message no consumer can read, are worked by the real confirm-withdrawal; then every figure
//! of the answer is what SQL counts in the workflow's own rows.

use crate::support;

use std::time::Duration;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::role::Role;
use paybus_bus::samples::BusSampler;
use serde_json::{Value, json};
use support::{Api, admin_get, admin_post, console_cookie, error_of, signed};
use tower::ServiceExt;

const WITHDRAWALS: u64 = 12;
const CONFIRMED_TWICE: u64 = 3;

async fn count(api: &Api, sql: &'static str) -> u64 {
    u64::try_from(api.scalar(sql).await).unwrap()
}

fn sum(series: &Value) -> u64 {
    series
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap_or(0))
        .sum()
}

fn function<'a>(activity: &'a Value, name: &str) -> &'a Value {
    activity["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {activity}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_figures_are_what_the_workflows_rows_say() {
    let api = Api::new().await;
    let confirm_withdrawal = paybus_catalog::FUNCTIONS
        .iter()
        .find(|function| function.name == "confirm-withdrawal")
        .unwrap();
    let deliver_webhook = paybus_catalog::FUNCTIONS
        .iter()
        .find(|function| function.name == "deliver-webhook")
        .unwrap();
    // The partners' notifications wait in deliver-webhook's queue (not running here).
    api.services
        .declare_topology(&[confirm_withdrawal.queue, deliver_webhook.queue])
        .await
        .unwrap();
    let (status, partner) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": "Charted", "webhook_url": "http://127.0.0.1:9/hooks",
                    "webhook_secret": "charted-partner-signing-secret"}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{partner}");
    let mut ids = Vec::new();
    for n in 0..WITHDRAWALS {
        let (status, created) = api
            .call(admin_post(
                "/v1/admin/withdrawals",
                &json!({"partner_id": partner["id"], "status": "BROADCASTING",
                        "currency": "USDT", "amount": "10", "to_address": format!("T-chart-{n}")}),
            ))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        ids.push(created["id"].as_u64().unwrap());
    }
    let confirm = |id: u64| {
        let body =
            json!({"withdrawal_id": id, "tx_hash": format!("0x{:064x}", id + 0xc4a27)}).to_string();
        signed("/v1/chain-monitor/withdrawal-confirmations", &body)
    };
    for id in &ids {
        let (status, answer) = api.call(confirm(*id)).await;
        assert!(status.is_success(), "{answer}");
    }
    for id in ids.iter().take(CONFIRMED_TWICE as usize) {
        let (status, answer) = api.call(confirm(*id)).await;
        assert!(status.is_success(), "{answer}");
    }
    // A producer that is not ours: a body no consumer can read, dead-lettered as malformed.
    let channel = api.services.connection().create_channel().await.unwrap();
    channel
        .basic_publish(
            "paybus.events".into(),
            confirm_withdrawal.queue.routing_key.into(),
            lapin::options::BasicPublishOptions::default(),
            b"not json",
            lapin::BasicProperties::default().with_message_id("unreadable-1".into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();

    let mut runner = paybus_runtime::runner::Runner::new(api.services.clone());
    confirm_withdrawal.add_to(&mut runner).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(runner.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let confirmed = count(
            &api,
            "SELECT COUNT(*) FROM withdrawals WHERE status = 'CONFIRMED'",
        )
        .await;
        let recorded = count(&api, "SELECT COUNT(*) FROM dead_letters").await;
        if confirmed == WITHDRAWALS && recorded == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "confirmed {confirmed}, dead letters {recorded}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every duplicate worked too: the intake's messages are all settled once none is left.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let sampler = BusSampler::new(
        api.env.db.clone(),
        api.services.link.clone(),
        vec![confirm_withdrawal.queue.queue()],
    );
    sampler.sample().await.unwrap();

    for window in ["hour", "day"] {
        let (status, activity) = api
            .call(admin_get(&format!("/v1/admin/activity?window={window}")))
            .await;
        assert_eq!(status, StatusCode::OK, "{activity}");
        let buckets = activity["buckets"].as_array().unwrap().len();
        assert_eq!(buckets, if window == "hour" { 60 } else { 24 });
        let confirmations = function(&activity, "confirm-withdrawal");
        assert_eq!(
            sum(&confirmations["done"]),
            count(
                &api,
                "SELECT COUNT(*) FROM withdrawals WHERE status = 'CONFIRMED'"
            )
            .await,
            "{window}: {confirmations}"
        );
        assert_eq!(
            sum(&confirmations["skipped"]),
            CONFIRMED_TWICE,
            "{confirmations}"
        );
        assert_eq!(
            sum(&confirmations["failed"]),
            count(
                &api,
                "SELECT COUNT(*) FROM dead_letters WHERE function_name = 'confirm-withdrawal'"
            )
            .await,
            "{confirmations}"
        );
        assert_eq!(sum(&confirmations["retried"]), 0);
        assert_eq!(confirmations["done"].as_array().unwrap().len(), buckets);
        assert_eq!(sum(&function(&activity, "grant-bonus")["done"]), 0);
        let queue = activity["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == confirm_withdrawal.queue.queue().as_str())
            .unwrap();
        assert_eq!(queue["ready"][buckets - 1], 0, "sampled drained: {queue}");
        assert!(
            activity["outbox_backlog"][buckets - 1].is_u64(),
            "{activity}"
        );
        let dead = &activity["dead_letters"][0];
        assert_eq!(dead["function"], "confirm-withdrawal", "{activity}");
        assert_eq!(
            sum(&dead["per_hour"]),
            count(&api, "SELECT COUNT(*) FROM dead_letter_failures").await
        );
    }

    // The console draws the same figures, each chart with them in its table.
    let cookie = console_cookie(&api, &[Role::Ops]).await;
    let confirmed = count(
        &api,
        "SELECT COUNT(*) FROM withdrawals WHERE status = 'CONFIRMED'",
    )
    .await;
    let failed = count(&api, "SELECT COUNT(*) FROM dead_letter_failures").await;
    for page in ["/console/overview", "/console/overview?window=day"] {
        let answer = api
            .router()
            .oneshot(
                Request::get(page)
                    .header(header::COOKIE, &cookie)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{page}");
        let html = String::from_utf8(
            axum::body::to_bytes(answer.into_body(), 1 << 22)
                .await
                .unwrap()
                .to_vec(),
        )
        .unwrap();
        assert!(
            html.contains(&format!(
                "The numbers: done {confirmed}, skipped {CONFIRMED_TWICE}, retried 0, failed {failed}"
            )),
            "{page}: {html}"
        );
        assert!(html.contains(r#"id="chart-confirm-withdrawal""#), "{page}");
        assert!(html.contains(r#"id="chart-dead-letters""#), "{page}");
        assert!(
            html.contains("grant-bonus"),
            "a quiet function is named: {page}"
        );
    }

    let (status, refused) = api.call(admin_get("/v1/admin/activity?window=week")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert!(error_of(&refused).contains("window"), "{refused}");
    let (status, _) = api
        .call(
            Request::get("/v1/admin/activity")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
