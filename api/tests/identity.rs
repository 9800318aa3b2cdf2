//! People act as who the identity provider says: a real OpenID provider (`paybus_testkit::oidc`,
//! panva's oidc-provider) issues the tokens, the API checks them against its discovery
//! document and keys. A token the provider issued works with the role its groups map to;
//! expired, foreign, forged, algorithm-confused, unsigned and rotated-out tokens are 401; a
//! key rotated in works without a restart; break-glass tokens work only where enabled, marked,
//! and never as one of four eyes.

use crate::support;

use std::time::{Duration, Instant};

use axum::{
    body::Body,
    http::{Method, Request, StatusCode, header},
};
use paybus_api::role::Role;
use serde_json::{Value, json};
use support::*;

fn bearer(method: Method, path: &str, token: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"reason": "identity test"}"#))
        .unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

const READ: &str = "/v1/admin/functions";
const CHANGE: &str = "/v1/admin/functions/canary/pause";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signed_in_with_the_provider_acts_with_the_role_their_groups_map_to() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let provider = api.provider.as_ref().unwrap();
    // Signed in as a person does: the device flow, approved on the provider's own pages.
    let alice = provider.device_login("alice").await.access_token;
    let dave = provider.device_login("dave").await.access_token;
    let carol = provider.device_login("carol").await.access_token;

    let (read, listed) = api.call(bearer(Method::GET, READ, &alice)).await;
    let (paused, answer) = api.call(bearer(Method::POST, CHANGE, &alice)).await;
    let (ops_read, _) = api.call(bearer(Method::GET, READ, &dave)).await;
    let (ops_change, refused) = api.call(bearer(Method::POST, CHANGE, &dave)).await;
    let (nobody_reads, nobody) = api.call(bearer(Method::GET, READ, &carol)).await;

    assert_eq!(read, StatusCode::OK, "{listed}");
    assert_eq!(paused, StatusCode::OK, "{answer}");
    assert_eq!(ops_read, StatusCode::OK);
    assert_eq!(ops_change, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(nobody_reads, StatusCode::FORBIDDEN, "{nobody}");
    let logged: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT actor, actor_issuer, actor_subject, auth_method FROM ops_log ORDER BY seq",
    )
    .fetch_all(&api.env.db)
    .await
    .unwrap();
    assert_eq!(
        logged,
        [(
            "alice@example.com".to_owned(),
            provider.issuer(),
            "alice".to_owned(),
            "OIDC".to_owned()
        )],
        "the pause is logged as the person the provider vouched for"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_the_provider_did_not_issue_for_us_now_are_refused() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let provider = api.provider.as_ref().unwrap();
    let with = |change: &dyn Fn(&mut Value)| {
        let mut claims = provider.claims_for("alice");
        change(&mut claims);
        claims
    };
    let good = provider.sign(provider.claims_for("alice"));
    let expired = provider.sign(with(&|c| {
        c["exp"] = json!(now() - 120);
        c["iat"] = json!(now() - 720);
    }));
    let not_yet = provider.sign(with(&|c| c["nbf"] = json!(now() + 600)));
    let other_audience = provider.sign(with(&|c| c["aud"] = json!("urn:someone-else")));
    let other_issuer = provider.sign(with(&|c| c["iss"] = json!("https://evil.example")));
    let confused = provider.sign_hs256_with_public_key(provider.claims_for("alice"));
    let unsigned = provider.unsigned(provider.claims_for("alice"));
    let unknown_key = provider.sign_with_unknown_key(provider.claims_for("alice"));
    let tampered = {
        let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
        parts[1] = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            with(&|c| c["sub"] = json!("bob")).to_string(),
        );
        parts.join(".")
    };

    let (accepted, _) = api.call(bearer(Method::GET, READ, &good)).await;
    assert_eq!(accepted, StatusCode::OK, "the control: a good token works");
    for (case, token, says) in [
        ("expired", &expired, "expired token"),
        ("not valid yet", &not_yet, "not valid yet"),
        ("another audience", &other_audience, "another audience"),
        ("another issuer", &other_issuer, "another issuer"),
        (
            "HS256 keyed with the provider's public key",
            &confused,
            "invalid token",
        ),
        ("alg none", &unsigned, "invalid token"),
        (
            "a key the provider never published",
            &unknown_key,
            "not the provider's",
        ),
        (
            "a payload changed after signing",
            &tampered,
            "invalid token",
        ),
    ] {
        let (status, body) = api.call(bearer(Method::GET, READ, token)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {body}");
        assert!(error_of(&body).contains(says), "{case}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotated_in_works_without_a_restart_and_one_rotated_out_stops_working() {
    let Some(mut api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let before = {
        let provider = api.provider.as_ref().unwrap();
        provider.sign(provider.claims_for("alice"))
    };
    let (status, _) = api.call(bearer(Method::GET, READ, &before)).await;
    assert_eq!(status, StatusCode::OK, "the key in use before the rotation");

    let provider = std::sync::Arc::get_mut(api.provider.as_mut().unwrap()).unwrap();
    provider.rotate_keys(false).await;
    let after = provider.sign(provider.claims_for("alice"));
    let retired = provider.sign_with_retired_key(provider.claims_for("alice"));
    // The API fetches the keys again for the new kid, at most every few seconds.
    let started = Instant::now();
    let works = loop {
        let (status, _) = api.call(bearer(Method::GET, READ, &after)).await;
        if status == StatusCode::OK || started.elapsed() > Duration::from_secs(15) {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (old, old_body) = api.call(bearer(Method::GET, READ, &before)).await;
    let (retired_status, retired_body) = api.call(bearer(Method::GET, READ, &retired)).await;

    assert_eq!(works, StatusCode::OK, "the new key, without a restart");
    assert_eq!(old, StatusCode::UNAUTHORIZED, "{old_body}");
    assert_eq!(retired_status, StatusCode::UNAUTHORIZED, "{retired_body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_works_only_where_enabled_is_marked_and_is_never_one_of_four_eyes() {
    let Some(off) = Api::with_provider(|config| config.break_glass = false).await else {
        return;
    };
    let (status, body) = off
        .call(bearer(Method::GET, READ, &token(&[Role::Admin])))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(
        error_of(&body).contains("PAYBUS_BREAK_GLASS is off"),
        "{body}"
    );

    let Some(on) = Api::with_provider(|_| {}).await else {
        return;
    };
    let glass = token(&[Role::Admin]);
    let (paused, _) = on.call(bearer(Method::POST, CHANGE, &glass)).await;
    assert_eq!(paused, StatusCode::OK);
    let marked: (String, String) =
        sqlx::query_as("SELECT actor, auth_method FROM ops_log ORDER BY seq DESC LIMIT 1")
            .fetch_one(&on.env.db)
            .await
            .unwrap();
    assert_eq!(
        marked,
        ("tests (break-glass)".to_owned(), "BREAK_GLASS".to_owned())
    );
    let (_, metrics) = on
        .call(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l.starts_with("paybus_break_glass_requests_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    // The overview shows it to everyone who looks, and a person's change is not counted.
    let (resumed, _) = on
        .call(bearer(
            Method::POST,
            &CHANGE.replace("/pause", "/resume"),
            &on.person("alice"),
        ))
        .await;
    assert_eq!(resumed, StatusCode::OK);
    let (_, overview) = on
        .call(bearer(
            Method::GET,
            "/v1/admin/overview",
            &on.person("dave"),
        ))
        .await;
    let shown = &overview["break_glass"];
    assert_eq!(shown["enabled"], true, "{overview}");
    assert_eq!(shown["changes_last_day"], 1, "{overview}");
    assert_eq!(shown["names"], serde_json::json!(["tests (break-glass)"]));
    assert!(shown["last_change_at"].is_string(), "{overview}");
    let (_, quiet) = off
        .call(bearer(
            Method::GET,
            "/v1/admin/overview",
            &off.person("dave"),
        ))
        .await;
    assert_eq!(quiet["break_glass"]["enabled"], false, "{quiet}");
    assert_eq!(quiet["break_glass"]["changes_last_day"], 0, "{quiet}");

    // Four-eyes: a job retry asked by a person, then "approved" with the break-glass token.
    let job = failed_job(&on).await;
    let (held, asked) = on
        .call(bearer(
            Method::POST,
            &format!("/v1/admin/charge-event-jobs/{job}/retry"),
            &on.person("alice"),
        ))
        .await;
    assert_eq!(held, StatusCode::ACCEPTED, "{asked}");
    let approval = asked["approval"]["id"].as_str().unwrap();
    let (status, refused) = on
        .call(bearer(
            Method::POST,
            &format!("/v1/admin/approvals/{approval}/approve"),
            &glass,
        ))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        error_of(&refused).contains("needs two people the identity provider vouches for"),
        "{refused}"
    );
    let (status, asked_by_glass) = on
        .call(bearer(
            Method::POST,
            &format!("/v1/admin/charge-event-jobs/{job}/retry"),
            &glass,
        ))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{asked_by_glass}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_learn_the_provider_from_the_api_and_no_provider_is_a_404() {
    let Some(api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let (status, config) = api
        .call(Request::get("/v1/auth/config").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK, "{config}");
    let provider = api.provider.as_ref().unwrap();
    assert_eq!(
        config,
        json!({"issuer": provider.issuer(), "audience": provider.audience(),
               "cli_client_id": "paybus-cli"})
    );
    let (status, document) = api
        .call(Request::get("/openapi.json").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        document["components"]["securitySchemes"]["oidc"]["openIdConnectUrl"],
        provider.discovery_url()
    );

    let none = Api::new().await;
    let (status, body) = none
        .call(Request::get("/v1/auth/config").body(Body::empty()).unwrap())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_cannot_be_reached_is_a_503_not_a_401() {
    let Some(mut api) = Api::with_provider(|_| {}).await else {
        return;
    };
    let token = api.person("alice");
    // The provider goes away before the API ever fetched its keys.
    drop(api.provider.take());
    let (status, body) = api.call(bearer(Method::GET, READ, &token)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(error_of(&body).contains("identity provider"), "{body}");
}

/// A FAILED bonus job; its id.
async fn failed_job(api: &Api) -> u64 {
    use paybus_bonuses::{BonusRules, charge::PaymentGateway, completion};
    use paybus_testkit::bonuses;
    let db = &api.env.db;
    bonuses::active_event(db, "identity 10%", 10, 9).await;
    let member = bonuses::member(db).await;
    let purchase = bonuses::purchase(db, member, PaymentGateway::Pg, 100).await;
    let completed = completion::complete(
        &api.services.outbox,
        BonusRules::default(),
        &purchase.paid(),
    )
    .await
    .unwrap();
    let job = completed.charge().bonus_jobs[0].job_id;
    sqlx::query("UPDATE charge_event_job SET status = 'FAILED', retry_count = 3 WHERE id = ?")
        .bind(job)
        .execute(db)
        .await
        .unwrap();
    job
}
