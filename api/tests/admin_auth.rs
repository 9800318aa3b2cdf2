//! Walks the OpenAPI document and calls every admin operation (those that require the
//! `admin_token` scheme) without a token, with a bad one, an expired one and one without the
//! role: 401, 401, 401, 403 — never a 2xx and never a 5xx, whatever the route.

use crate::support;

use axum::{
    body::Body,
    http::{Method, Request, StatusCode, header},
};
use paybus_api::{
    auth::{self, Claims},
    role::Role,
};
use serde_json::Value;
use support::{ADMIN_JWT_SECRET, Api, error_of, now, token};

/// A token whose expiry passed a minute ago, otherwise valid (ADMIN).
fn expired_token() -> String {
    let issued = now() as u64 - 3_600;
    auth::sign(
        ADMIN_JWT_SECRET,
        &Claims {
            sub: "tests".into(),
            roles: vec![Role::Admin],
            exp: issued + 3_540,
            iat: issued,
        },
    )
    .expect("sign")
}

/// Every operation that requires the admin token: (METHOD, path with its parameters filled).
fn admin_operations(document: &Value) -> Vec<(Method, String)> {
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            let needs_token = operation["security"]
                .as_array()
                .is_some_and(|schemes| schemes.iter().any(|s| s.get("admin_token").is_some()));
            if needs_token {
                let concrete = path.replace("{id}", "1").replace("{symbol}", "BTC-USDT");
                operations.push((
                    Method::from_bytes(method.to_uppercase().as_bytes()).expect("method"),
                    concrete,
                ));
            }
        }
    }
    operations
}

fn request(method: &Method, path: &str, authorization: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method.clone())
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(value) = authorization {
        builder = builder.header(header::AUTHORIZATION, value);
    }
    builder.body(Body::from("{}")).expect("request")
}

#[tokio::test]
async fn every_admin_operation_refuses_missing_bad_expired_and_underprivileged_tokens() {
    let api = Api::new().await;
    let document = serde_json::to_value(paybus_api::openapi::document()).expect("serialise");
    let operations = admin_operations(&document);
    assert!(
        operations.len() >= 25,
        "too few admin operations: {operations:?}"
    );
    let expired = format!("Bearer {}", expired_token());
    let forged = format!("Bearer {}x", token(&[Role::Admin]));

    let mut checked = 0;
    for (method, path) in &operations {
        // Reads need OPS: a token with no role lacks it. Changes need ADMIN: OPS lacks it.
        let weaker: &[Role] = if method == Method::GET {
            &[]
        } else {
            &[Role::Ops]
        };
        let underprivileged = format!("Bearer {}", token(weaker));
        for (case, authorization, expected) in [
            ("no token", None, StatusCode::UNAUTHORIZED),
            (
                "a bad token",
                Some(forged.as_str()),
                StatusCode::UNAUTHORIZED,
            ),
            (
                "an expired token",
                Some(expired.as_str()),
                StatusCode::UNAUTHORIZED,
            ),
            (
                "a token without the role",
                Some(underprivileged.as_str()),
                StatusCode::FORBIDDEN,
            ),
        ] {
            let (status, body) = api.call(request(method, path, authorization)).await;
            assert_eq!(
                status, expected,
                "{method} {path} with {case}: {status} {body}"
            );
            assert!(!error_of(&body).is_empty());
            checked += 1;
        }
    }
    assert_eq!(checked, operations.len() * 4);
    // Nothing reached a handler: no row was created by any of these calls.
    assert_eq!(api.scalar("SELECT COUNT(*) FROM partners").await, 0);
    assert_eq!(api.scalar("SELECT COUNT(*) FROM markets").await, 0);
}

#[tokio::test]
async fn an_expired_token_says_it_expired() {
    let api = Api::new().await;
    let (status, body) = api
        .call(request(
            &Method::GET,
            "/v1/admin/audit",
            Some(&format!("Bearer {}", expired_token())),
        ))
        .await;
    assert_eq!(
        (status, error_of(&body)),
        (StatusCode::UNAUTHORIZED, "expired token")
    );
}

/// The same walk with the identity provider's people: carol (no paybus group) on reads and
/// dave (OPS) on changes are refused 403; the provider's token expired, one for another
/// audience, and a break-glass token while break-glass is off are 401. Nothing reaches a
/// handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_operation_refuses_the_providers_people_without_the_role() {
    let Some(api) = Api::with_provider(|config| config.break_glass = false).await else {
        return;
    };
    let provider = api.provider.clone().expect("a provider");
    let document = serde_json::to_value(paybus_api::openapi::document()).expect("serialise");
    let operations = admin_operations(&document);
    let mut expired = provider.claims_for("alice");
    expired["exp"] = serde_json::json!(now() as u64 - 120);
    let expired = format!("Bearer {}", provider.sign(expired));
    let mut elsewhere = provider.claims_for("alice");
    elsewhere["aud"] = serde_json::json!("urn:another:api");
    let elsewhere = format!("Bearer {}", provider.sign(elsewhere));
    let glass = format!("Bearer {}", token(&[Role::Admin]));
    let carol = format!("Bearer {}", api.person("carol"));
    let dave = format!("Bearer {}", api.person("dave"));

    for (method, path) in &operations {
        let underprivileged = if method == Method::GET { &carol } else { &dave };
        for (case, authorization, expected) in [
            ("an expired token", &expired, StatusCode::UNAUTHORIZED),
            ("another API's token", &elsewhere, StatusCode::UNAUTHORIZED),
            ("break-glass while off", &glass, StatusCode::UNAUTHORIZED),
            (
                "a person without the role",
                underprivileged,
                StatusCode::FORBIDDEN,
            ),
        ] {
            let (status, body) = api
                .call(request(method, path, Some(authorization.as_str())))
                .await;
            assert_eq!(
                status, expected,
                "{method} {path} with {case}: {status} {body}"
            );
            assert!(!error_of(&body).is_empty());
        }
    }
    assert_eq!(api.scalar("SELECT COUNT(*) FROM partners").await, 0);
    assert_eq!(api.scalar("SELECT COUNT(*) FROM ops_log").await, 0);
}
