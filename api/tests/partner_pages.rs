//! The console's partner pages against real partners: three HTTP servers (one answers 410
//! Gone, one 500, one 200) and the real deliver-webhook consuming from the real broker. The
//! pages show the endpoint the 410 disabled and the breaker the failures opened, each with
//! since when, every delivery attempt, and the keys; a re-delivery clicked on the page reaches
//! the partner again under the same `webhook-id`; a key rotated and revoked from the page is
//! refused by the partner API from then on.

use crate::support;

use std::time::Duration;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::role::Role;
use paybus_deliver_webhook::{DeliverWebhook, WebhookConfig, request::HEADER_WEBHOOK_ID};
use paybus_partners::{
    breaker::BreakerPolicy,
    notifications::{self, NewNotification},
};
use paybus_runtime::runner::Runner;
use paybus_testkit::eventually;
use serde_json::json;
use support::{Api, admin_post, console_cookie, partner_get};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

/// A partner's HTTP server answering every POST with `status`.
async fn partner_server(status: u16) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(status))
        .mount(&server)
        .await;
    server
}

/// A partner created through the admin API, its webhooks going to `server`.
async fn partner(api: &Api, name: &str, server: &MockServer) -> u64 {
    let (status, answer) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": name, "webhook_url": format!("{}/hooks", server.uri())}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    answer["id"].as_u64().unwrap()
}

/// Notifications as the confirmations enqueue them (one per withdrawal confirmed).
async fn notify(api: &Api, partner_id: u64, withdrawals: std::ops::Range<u64>) -> Vec<u64> {
    let mut uow = api.services.outbox.begin().await.unwrap();
    let mut ids = Vec::new();
    for withdrawal in withdrawals {
        let payload = json!({"withdrawal_id": withdrawal});
        let notification = NewNotification {
            partner_id,
            event: "WITHDRAWAL_CONFIRMED",
            reference_type: "WITHDRAWAL",
            reference_id: withdrawal,
            payload: &payload,
        };
        let id = notifications::enqueue(&mut uow, &notification, uuid::Uuid::new_v4())
            .await
            .unwrap()
            .unwrap();
        ids.push(id);
    }
    uow.commit().await.unwrap();
    ids
}

struct Page {
    status: StatusCode,
    cache_control: Option<String>,
    body: String,
}

async fn console(api: &Api, cookie: &str, method: &str, path: &str, form: &str) -> Page {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form.to_owned()))
        .unwrap();
    let response = api.router().oneshot(request).await.unwrap();
    let status = response.status();
    let cache_control = response
        .headers()
        .get(header::CACHE_CONTROL)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 22)
        .await
        .unwrap();
    Page {
        status,
        cache_control,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The `<tr …>` row opening tag with these attributes, e.g. a partner and its state.
fn row(class: &str, id: u64, attribute: &str, value: &str) -> String {
    format!(r#"<tr class="{class}" data-id="{id}" {attribute}="{value}">"#)
}

/// The first `pbk_…` key shown in the page's "new key" box.
fn new_key(body: &str) -> String {
    let start = body.find(r#"id="new-key""#).expect("a new key on the page");
    let key_at = start + body[start..].find("pbk_").expect("pbk_ in the box");
    body[key_at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect()
}

async fn partner_api_status(api: &Api, key: &str) -> StatusCode {
    api.call(partner_get("/v1/partner/notifications", key))
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partner_pages_show_a_real_410_a_breaker_opened_by_real_failures_and_redeliver_under_the_same_webhook_id()
 {
    let api = Api::new().await;
    let (gone_server, broken_server, healthy_server) = (
        partner_server(410).await,
        partner_server(500).await,
        partner_server(200).await,
    );
    let gone = partner(&api, "gone partner", &gone_server).await;
    let broken = partner(&api, "broken partner", &broken_server).await;
    let healthy = partner(&api, "healthy partner", &healthy_server).await;
    let key = api.partner_key(healthy).await;
    assert_eq!(partner_api_status(&api, &key).await, StatusCode::OK);
    let key_id: u64 = key.split('_').nth(1).unwrap().parse().unwrap();

    // The real deliverer, its breaker opening at 5 consecutive failures and staying open long
    // enough to be read.
    let breaker = BreakerPolicy {
        failures_to_open: 5,
        cool_down: Duration::from_secs(600),
    };
    let services = api
        .env
        .services(&paybus_catalog::queues(&Default::default()))
        .await;
    let mut runner = Runner::new(services);
    runner.add_function(
        DeliverWebhook::new(
            WebhookConfig {
                breaker,
                ..WebhookConfig::default()
            },
            paybus_testkit::sealer(),
        )
        .unwrap(),
    );
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(runner.run(shutdown.clone()));

    notify(&api, gone, 1..2).await;
    notify(&api, broken, 2..7).await;
    let delivered = notify(&api, healthy, 7..8).await[0];
    let settled = || async {
        let row: (bool, bool, String) = sqlx::query_as(
            "SELECT \
               (SELECT webhook_disabled_at IS NOT NULL FROM partners WHERE id = ?), \
               (SELECT COALESCE(webhook_open_until > NOW(6), FALSE) FROM partners WHERE id = ?), \
               (SELECT status FROM partner_notifications WHERE id = ?)",
        )
        .bind(gone)
        .bind(broken)
        .bind(delivered)
        .fetch_one(&api.env.db)
        .await
        .unwrap();
        row == (true, true, "DELIVERED".to_owned())
    };
    assert!(
        eventually(Duration::from_secs(30), settled).await,
        "the 410 did not disable the endpoint, the failures did not open the breaker, or the \
         healthy partner's notification was not delivered within 30 s"
    );

    let cookie = console_cookie(&api, &[Role::Admin]).await;
    let list = console(&api, &cookie, "GET", "/console/partners", "").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    for (id, state) in [
        (gone, "disabled"),
        (broken, "breaker_open"),
        (healthy, "active"),
    ] {
        assert!(
            list.body.contains(&row("partner", id, "data-state", state)),
            "partner {id} is not shown {state}:\n{}",
            list.body
        );
    }
    assert!(list.body.contains("disabled since "), "{}", list.body);
    assert!(list.body.contains("HTTP 410"), "{}", list.body);
    assert!(
        list.body.contains("breaker open since ")
            && list.body.contains("after 5 consecutive failures"),
        "{}",
        list.body
    );

    // The broken partner's page: each notification with its one failed POST.
    let broken_page = console(
        &api,
        &cookie,
        "GET",
        &format!("/console/partners/{broken}"),
        "",
    )
    .await;
    assert_eq!(broken_page.status, StatusCode::OK, "{}", broken_page.body);
    assert!(
        broken_page
            .body
            .contains(r#"<section id="endpoint" data-state="breaker_open""#)
    );
    assert_eq!(
        broken_page
            .body
            .matches(r#"data-status-code="500""#)
            .count(),
        5,
        "{}",
        broken_page.body
    );
    assert_eq!(broken_page.body.matches("HTTP 500 · ").count(), 5);

    // The healthy partner's page: its key used, its notification delivered once.
    let healthy_page = console(
        &api,
        &cookie,
        "GET",
        &format!("/console/partners/{healthy}"),
        "",
    )
    .await;
    assert!(
        healthy_page
            .body
            .contains(&row("key", key_id, "data-state", "active")),
        "{}",
        healthy_page.body
    );
    assert!(
        !healthy_page
            .body
            .contains(r#"<td class="last-used">never</td>"#),
        "the key was used once: {}",
        healthy_page.body
    );
    assert!(healthy_page.body.contains(&row(
        "notification",
        delivered,
        "data-status",
        "DELIVERED"
    )));
    assert_eq!(healthy_server.received_requests().await.unwrap().len(), 1);

    // Re-delivered from the page: the partner gets it again under the same webhook-id.
    let redelivered = console(
        &api,
        &cookie,
        "POST",
        &format!("/console/partners/{healthy}/notifications/{delivered}/redeliver"),
        "",
    )
    .await;
    assert_eq!(redelivered.status, StatusCode::OK, "{}", redelivered.body);
    assert!(
        redelivered
            .body
            .contains(&format!("Notification {delivered} queued for re-delivery")),
        "{}",
        redelivered.body
    );
    let twice = || async { healthy_server.received_requests().await.unwrap().len() == 2 };
    assert!(
        eventually(Duration::from_secs(30), twice).await,
        "the re-delivery did not reach the partner within 30 s"
    );
    let webhook_ids: Vec<String> = healthy_server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.headers[HEADER_WEBHOOK_ID].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(webhook_ids[0], webhook_ids[1]);
    assert!(
        api.ops_actions()
            .await
            .iter()
            .any(
                |(_, action, subject)| action == "partner_notification.redeliver"
                    && *subject == format!("partner_notification:{delivered}")
            ),
        "the re-delivery is in the ops log"
    );

    // Rotated from the page with no overlap: the new key is shown once (never cached) and
    // works; the old one is refused. Revoked from the page: the new one is refused too.
    let rotated = console(
        &api,
        &cookie,
        "POST",
        &format!("/console/partners/{healthy}/api-keys/{key_id}/rotate"),
        "overlap_seconds=0",
    )
    .await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    assert_eq!(rotated.cache_control.as_deref(), Some("no-store"));
    let replacement = new_key(&rotated.body);
    assert_ne!(replacement, key);
    assert_eq!(
        partner_api_status(&api, &key).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(partner_api_status(&api, &replacement).await, StatusCode::OK);
    let shown_again = console(
        &api,
        &cookie,
        "GET",
        &format!("/console/partners/{healthy}"),
        "",
    )
    .await;
    assert!(
        !shown_again.body.contains(&replacement),
        "a key is shown once"
    );
    assert_eq!(shown_again.cache_control, None);
    let replacement_id: u64 = replacement.split('_').nth(1).unwrap().parse().unwrap();
    let revoked = console(
        &api,
        &cookie,
        "POST",
        &format!("/console/partners/{healthy}/api-keys/{replacement_id}/revoke"),
        "",
    )
    .await;
    assert!(
        revoked
            .body
            .contains(&row("key", replacement_id, "data-state", "revoked")),
        "{}",
        revoked.body
    );
    assert_eq!(
        partner_api_status(&api, &replacement).await,
        StatusCode::UNAUTHORIZED
    );

    // OPS reads the pages but cannot act; nonsense ids are a 400, unknown ones a 404.
    let ops = console_cookie(&api, &[Role::Ops]).await;
    let read = console(
        &api,
        &ops,
        "GET",
        &format!("/console/partners/{healthy}"),
        "",
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    let refused = console(
        &api,
        &ops,
        "POST",
        &format!("/console/partners/{healthy}/notifications/{delivered}/redeliver"),
        "",
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let nonsense = console(&api, &cookie, "GET", "/console/partners/abc", "").await;
    assert_eq!(nonsense.status, StatusCode::BAD_REQUEST);
    let unknown = console(&api, &cookie, "GET", "/console/partners/999999", "").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);

    shutdown.cancel();
    run.await.unwrap().unwrap();
}
