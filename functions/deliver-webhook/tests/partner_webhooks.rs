//! Partner webhooks as tenants see them: secrets sealed at rest (the migration's fix-up),
//! Standard Webhooks signatures during a rotation, 410 Gone, per-attempt records and
//! re-delivery — against the real database and broker, with wiremock as the partner.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use paybus_bus::{Context, Envelope, Handler, Outcome, Services};
use paybus_config::signature;
use paybus_deliver_webhook::{
    DeliverWebhook, WebhookConfig,
    request::{HEADER_SIGNATURE, HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, standard_signature},
};
use paybus_partners::{
    attempts,
    notifications::{self, NotificationCreated, Redelivery},
    partner, webhook_secrets,
};
use paybus_testkit::{
    TestEnv,
    partners::{notification, partner_with_key},
    sealer,
};
use wiremock::{Mock, MockServer, Request, ResponseTemplate, matchers::method};

async fn handle(services: &Services, notification_id: u64) -> Outcome {
    let handler = DeliverWebhook::new(WebhookConfig::default(), sealer()).unwrap();
    let ctx = Context {
        db: &services.outbox,
        attempt: 1,
    };
    handler
        .handle(Envelope::new(NotificationCreated { notification_id }), &ctx)
        .await
        .unwrap()
}

async fn status_and_attempts(env: &TestEnv, id: u64) -> (String, u32) {
    sqlx::query_as("SELECT status, attempts FROM partner_notifications WHERE id = ?")
        .bind(id)
        .fetch_one(&env.db)
        .await
        .unwrap()
}

fn header<'r>(request: &'r Request, name: &str) -> &'r str {
    request
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// Whether `request`'s `webhook-signature` has an entry made with `key`.
fn standard_signed_with(request: &Request, key: &[u8]) -> bool {
    let timestamp: i64 = header(request, "webhook-timestamp").parse().unwrap();
    let expected = standard_signature(
        std::iter::once(key),
        header(request, HEADER_WEBHOOK_ID),
        timestamp,
        &request.body,
    );
    header(request, HEADER_WEBHOOK_SIGNATURE)
        .split(' ')
        .any(|entry| entry == expected)
}

#[tokio::test]
async fn the_sealing_step_leaves_no_plaintext_and_delivery_still_signs_with_the_old_secret() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let old_secret = "legacy-plaintext-secret-of-acme-0001";
    let partner_id = sqlx::query(
        "INSERT INTO partners (name, webhook_url, webhook_secret) VALUES ('acme', ?, ?)",
    )
    .bind(server.uri())
    .bind(old_secret)
    .execute(&env.db)
    .await
    .unwrap()
    .last_insert_id();
    let mut conn = env.db.acquire().await.unwrap();
    let flagged = paybus_partners::audit::plaintext_secrets(&mut conn)
        .await
        .unwrap();

    let without_key = webhook_secrets::seal_plaintext(&mut conn, None).await;
    let sealed = webhook_secrets::seal_plaintext(&mut conn, Some(&sealer()))
        .await
        .unwrap();
    let again = webhook_secrets::seal_plaintext(&mut conn, Some(&sealer()))
        .await
        .unwrap();

    assert_eq!(flagged.len(), 1, "the audit check sees the plaintext");
    assert!(
        without_key
            .unwrap_err()
            .to_string()
            .contains("PAYBUS_SECRETS_KEY")
    );
    assert_eq!((sealed.sealed, again.sealed), (1, 0));
    let dump: Vec<(Option<String>, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT p.webhook_secret, s.nonce, s.ciphertext FROM partners p \
         JOIN partner_webhook_secrets s ON s.partner_id = p.id",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(dump.len(), 1);
    let (plaintext, nonce, ciphertext) = &dump[0];
    assert_eq!(plaintext, &None);
    let needle = old_secret.as_bytes();
    for bytes in [nonce, ciphertext] {
        assert!(!bytes.windows(needle.len()).any(|w| w == needle));
    }
    assert!(
        paybus_partners::audit::plaintext_secrets(&mut conn)
            .await
            .unwrap()
            .is_empty()
    );

    let id = notification(&env.db, partner_id, 1).await;
    assert_eq!(handle(&services, id).await, Outcome::Done);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    let verified = signature::verify(
        needle,
        Some(header(&requests[0], HEADER_SIGNATURE)),
        &requests[0].body,
        Utc::now().timestamp(),
        signature::DEFAULT_TOLERANCE,
    );
    assert_eq!(verified, Ok(()));
    assert!(standard_signed_with(&requests[0], needle));
}

#[tokio::test]
async fn during_a_rotation_both_secrets_sign_and_after_the_overlap_only_the_new_one() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let old_key = [1u8; 32];
    let partner_id = partner_with_key(&env.db, "acme", Some(&server.uri()), &old_key).await;
    let mut conn = env.db.acquire().await.unwrap();

    let revealed = webhook_secrets::rotate(
        &mut conn,
        &sealer(),
        partner_id,
        Duration::from_secs(3600),
        &paybus_testkit::person("ops"),
    )
    .await
    .unwrap();
    let new_key = webhook_secrets::parse(revealed.expose()).unwrap();
    let first = notification(&env.db, partner_id, 1).await;
    assert_eq!(handle(&services, first).await, Outcome::Done);
    // The overlap ends: expire every secret but the newest.
    sqlx::query(
        "UPDATE partner_webhook_secrets SET expires_at = NOW(6) - INTERVAL 1 SECOND \
         WHERE partner_id = ? AND expires_at IS NOT NULL",
    )
    .bind(partner_id)
    .execute(&env.db)
    .await
    .unwrap();
    let second = notification(&env.db, partner_id, 2).await;
    assert_eq!(handle(&services, second).await, Outcome::Done);

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(header(&requests[0], HEADER_WEBHOOK_ID), first.to_string());
    assert_eq!(
        header(&requests[0], HEADER_WEBHOOK_SIGNATURE)
            .split(' ')
            .count(),
        2
    );
    assert!(standard_signed_with(&requests[0], &old_key));
    assert!(standard_signed_with(&requests[0], &new_key));
    assert!(!standard_signed_with(&requests[1], &old_key));
    assert!(standard_signed_with(&requests[1], &new_key));
    assert!(format!("{revealed:?}").contains("***"));
    let unrelated = webhook_secrets::rotate(
        &mut conn,
        &sealer(),
        999_999,
        Duration::from_secs(1),
        &paybus_testkit::person("ops"),
    )
    .await;
    assert!(matches!(
        unrelated,
        Err(webhook_secrets::WebhookSecretError::PartnerNotFound(
            999_999
        ))
    ));
}

#[tokio::test]
async fn a_410_disables_the_endpoint_parks_without_losing_the_notification_until_the_url_is_set() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let gone = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(410).set_body_string("endpoint removed"))
        .mount(&gone)
        .await;
    let healthy = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&healthy)
        .await;
    let partner_id =
        partner_with_key(&env.db, "acme", Some(&gone.uri()), b"0123456789abcdef").await;
    let first = notification(&env.db, partner_id, 1).await;
    let second = notification(&env.db, partner_id, 2).await;

    let answered_gone = handle(&services, first).await;
    // Due now (to skip waiting for the park): the second is parked without a POST.
    sqlx::query("UPDATE partner_notifications SET next_attempt_at = NOW(6) WHERE id IN (?, ?)")
        .bind(first)
        .bind(second)
        .execute(&env.db)
        .await
        .unwrap();
    let parked = handle(&services, second).await;
    let mut conn = env.db.acquire().await.unwrap();
    let shown = partner::find(&mut conn, partner_id).await.unwrap().unwrap();

    assert!(matches!(answered_gone, Outcome::Skipped(ref r) if r.contains("410")));
    assert!(matches!(parked, Outcome::Skipped(ref r) if r.contains("disabled")));
    assert_eq!(gone.received_requests().await.unwrap().len(), 1);
    assert_eq!(
        status_and_attempts(&env, first).await,
        ("PENDING".to_owned(), 0)
    );
    assert_eq!(
        status_and_attempts(&env, second).await,
        ("PENDING".to_owned(), 0)
    );
    assert!(shown.webhook_disabled.is_some());
    let recorded = attempts::of_notification(&mut conn, partner_id, first)
        .await
        .unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].status_code, Some(410));
    assert!(
        attempts::of_notification(&mut conn, partner_id, second)
            .await
            .unwrap()
            .is_empty(),
        "a parked delivery made no POST"
    );

    let existed = partner::set_webhook_url(
        &mut conn,
        partner_id,
        Some(&healthy.uri()),
        &paybus_testkit::person("ops"),
    )
    .await
    .unwrap();
    let missing =
        partner::set_webhook_url(&mut conn, 999_999, None, &paybus_testkit::person("ops"))
            .await
            .unwrap();
    let invalid = partner::set_webhook_url(
        &mut conn,
        partner_id,
        Some("ftp://x"),
        &paybus_testkit::person("ops"),
    )
    .await;
    assert!(existed && !missing && invalid.is_err());
    let re_enabled = partner::find(&mut conn, partner_id).await.unwrap().unwrap();
    assert_eq!(re_enabled.webhook_disabled, None);
    assert_eq!(handle(&services, first).await, Outcome::Done);
    assert_eq!(handle(&services, second).await, Outcome::Done);
    assert_eq!(healthy.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn attempts_and_notifications_are_read_per_partner_and_a_redelivery_keeps_its_id() {
    let env = TestEnv::new().await;
    let services = env.services(&[]).await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let acme = partner_with_key(&env.db, "acme", Some(&server.uri()), b"0123456789abcdef").await;
    let other = partner_with_key(&env.db, "other", None, b"0123456789abcdef").await;
    let id = notification(&env.db, acme, 1).await;
    let older = notification(&env.db, acme, 2).await;
    let others = notification(&env.db, other, 3).await;

    assert!(matches!(handle(&services, id).await, Outcome::Retry { .. }));
    sqlx::query("UPDATE partner_notifications SET next_attempt_at = NOW(6) WHERE id = ?")
        .bind(id)
        .execute(&env.db)
        .await
        .unwrap();
    assert_eq!(handle(&services, id).await, Outcome::Done);
    let mut conn = env.db.acquire().await.unwrap();
    let recorded = attempts::of_notification(&mut conn, acme, id)
        .await
        .unwrap();
    let as_other = attempts::of_notification(&mut conn, other, id)
        .await
        .unwrap();

    assert_eq!(
        recorded
            .iter()
            .map(|a| (a.attempt, a.status_code, a.error.is_some()))
            .collect::<Vec<_>>(),
        [(1, Some(500), true), (2, Some(204), false)]
    );
    assert!(as_other.is_empty());
    let page = notifications::list_for_partner(&mut conn, acme, None, 10)
        .await
        .unwrap();
    assert_eq!(page.iter().map(|n| n.id).collect::<Vec<_>>(), [older, id]);
    let next = notifications::list_for_partner(&mut conn, acme, Some(older), 10)
        .await
        .unwrap();
    assert_eq!(next.iter().map(|n| n.id).collect::<Vec<_>>(), [id]);
    assert!(
        notifications::find_for_partner(&mut conn, acme, others)
            .await
            .unwrap()
            .is_none()
    );
    drop(conn);

    let acme_actor = paybus_ops::actor::Actor::partner(&format!("partner:{acme}"));
    let mut uow = services.outbox.begin().await.unwrap();
    let again = notifications::redeliver(&mut uow, acme, id, &acme_actor)
        .await
        .unwrap();
    let pending = notifications::redeliver(&mut uow, acme, older, &acme_actor)
        .await
        .unwrap();
    let not_ours = notifications::redeliver(&mut uow, acme, others, &acme_actor)
        .await
        .unwrap();
    uow.commit().await.unwrap();

    assert_eq!(
        (again, pending, not_ours),
        (
            Redelivery::Queued,
            Redelivery::AlreadyPending,
            Redelivery::NotFound
        )
    );
    assert_eq!(
        status_and_attempts(&env, id).await,
        ("PENDING".to_owned(), 0)
    );
    let messages: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM outbox_messages WHERE routing_key = 'partner.notification.created'",
    )
    .fetch_one(&env.db)
    .await
    .unwrap();
    assert_eq!(messages, 1, "the redelivery's message, in its transaction");
    assert_eq!(handle(&services, id).await, Outcome::Done);
    let last = server.received_requests().await.unwrap();
    assert_eq!(
        header(last.last().unwrap(), HEADER_WEBHOOK_ID),
        id.to_string()
    );
}

#[test]
fn a_generated_secret_is_a_standard_webhooks_secret() {
    let (key, revealed) = webhook_secrets::generate().unwrap();
    let encoded = revealed.expose().strip_prefix("whsec_").unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
        key.as_slice()
    );
}
