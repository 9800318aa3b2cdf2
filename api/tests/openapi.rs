//! The OpenAPI document is generated from the code, and these tests keep it whole: every
//! route the routers register is documented, every documented operation is served, and the
//! shipped copy (`api/openapi.json`) is what the code generates.
//!
//! The routers' table is read from the source (`.route("<path>", get(..).post(..))` in
//! `api/src`): axum cannot list its routes, and a route added without its annotation must
//! fail here, not in production's documentation.

use crate::support;

use std::{collections::BTreeSet, path::Path};

use axum::{
    body::Body,
    http::{Method, Request, StatusCode},
};
use serde_json::Value;
use support::{Api, admin_token};

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
const REGENERATE: &str = "cargo run -q -p paybus -- openapi > api/openapi.json";

/// Routes that are not part of the JSON API: the console's HTML pages.
const UNDOCUMENTED: &[&str] = &["/console"];

type Operation = (String, String);

fn documented(document: &Value) -> BTreeSet<Operation> {
    let paths = document["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("path item")
                .keys()
                .filter(|key| {
                    ["get", "post", "put", "patch", "delete", "head"].contains(&key.as_str())
                })
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

/// `(METHOD, path)` of every `.route(...)` call under `dir`.
fn routed_in_source(dir: &Path) -> BTreeSet<Operation> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("read api/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            found.extend(routed_in_source(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).expect("read source");
            found.extend(routes_of(&source, &path));
        }
    }
    found
}

fn routes_of(source: &str, file: &Path) -> Vec<Operation> {
    let mut routes = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find(".route(") {
        rest = &rest[start + ".route(".len()..];
        let args = rest.trim_start();
        let Some(literal) = args.strip_prefix('"') else {
            panic!(
                "{}: a route's path must be a string literal (the route table test reads it): \
                 .route({}",
                file.display(),
                &args[..args.len().min(40)]
            );
        };
        let end = literal.find('"').expect("closing quote");
        let route_path = &literal[..end];
        // The handler part: up to the `)` that closes `.route(`.
        let mut depth = 1;
        let mut handler_end = end + 1;
        for (i, c) in literal[end + 1..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                handler_end = end + 1 + i;
                break;
            }
        }
        let handlers = &literal[end + 1..handler_end];
        for method in ["get", "post", "put", "patch", "delete", "head"] {
            let call = format!("{method}(");
            let mut from = 0;
            while let Some(at) = handlers[from..].find(&call) {
                let absolute = from + at;
                let before = handlers[..absolute].chars().next_back();
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    routes.push((method.to_uppercase(), route_path.to_owned()));
                }
                from = absolute + call.len();
            }
        }
    }
    routes
}

fn is_documentable(path: &str) -> bool {
    !UNDOCUMENTED.iter().any(|prefix| path.starts_with(prefix))
}

#[test]
fn every_route_in_the_routers_is_documented_and_nothing_else() {
    let document = serde_json::to_value(paybus_api::openapi::document()).expect("serialise");
    let routed: BTreeSet<Operation> =
        routed_in_source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
            .into_iter()
            .filter(|(_, path)| is_documentable(path))
            .collect();
    let documented = documented(&document);
    assert!(
        routed.len() >= 30,
        "the source scan found too little: {routed:?}"
    );

    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty(),
        "routes without an OpenAPI annotation (see api/src/openapi.rs: annotate the handler \
         with #[utoipa::path] and list it in its module's Doc): {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "documented operations no router registers: {unrouted:?}"
    );
}

#[test]
fn the_shipped_document_is_what_the_code_generates() {
    let generated =
        serde_json::to_string_pretty(&paybus_api::openapi::document()).expect("serialise") + "\n";
    if std::env::var_os("PAYBUS_UPDATE_OPENAPI").is_some() {
        std::fs::write(SHIPPED, &generated).expect("write api/openapi.json");
    }
    let shipped = std::fs::read_to_string(SHIPPED).unwrap_or_default();
    assert!(
        shipped == generated,
        "api/openapi.json is stale: regenerate it with `{REGENERATE}`"
    );
}

/// A path with its parameters filled in with values of the right shape.
pub fn concrete(path: &str) -> String {
    path.replace("{id}", "1")
        .replace("{key_id}", "1")
        .replace("{symbol}", "BTC-USDT")
        .replace("{gateway}", "pg")
}

#[tokio::test]
async fn every_documented_operation_is_served_and_the_document_is_public() {
    let api = Api::new().await;
    let (status, served) = api
        .call(
            Request::get("/openapi.json")
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(
        served,
        serde_json::to_value(paybus_api::openapi::document()).expect("serialise")
    );

    for (method, path) in documented(&served) {
        let request = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(concrete(&path))
            .header("authorization", format!("Bearer {}", admin_token()))
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .expect("request");
        let (status, body) = api.call(request).await;
        let fell_through = status == StatusCode::NOT_FOUND
            && body["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("no route for"));
        assert!(
            !fell_through && status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} is documented but not served: {status} {body}"
        );
        assert!(
            !status.is_server_error(),
            "{method} {path} answered {status} {body}"
        );
    }
}

/// The role walk: every admin operation of the document refuses a request without a token
/// (401) and a change by OPS (403), and lets OPS read unless the operation says it is ADMIN's
/// (`x-paybus-role`).
#[tokio::test]
async fn every_admin_operation_needs_a_token_and_every_change_needs_the_admin_role() {
    let api = Api::new().await;
    let document = serde_json::to_value(paybus_api::openapi::document()).expect("serialise");
    let ops = support::token(&[paybus_api::role::Role::Ops]);
    let admin_operations: Vec<Operation> = documented(&document)
        .into_iter()
        .filter(|(_, path)| path.starts_with("/v1/admin"))
        .collect();
    assert!(admin_operations.len() >= 40, "{admin_operations:?}");
    for (method, path) in admin_operations {
        let request = |token: Option<&str>| {
            let mut builder = Request::builder()
                .method(Method::from_bytes(method.as_bytes()).expect("method"))
                .uri(concrete(&path))
                .header("content-type", "application/json");
            if let Some(token) = token {
                builder = builder.header("authorization", format!("Bearer {token}"));
            }
            builder.body(Body::from("{}")).expect("request")
        };
        let (status, body) = api.call(request(None)).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path} without a token: {body}"
        );
        let (status, body) = api.call(request(Some(&ops))).await;
        // An operation may ask for more than the general rule (a security view, ADMIN only).
        let admin_only =
            document["paths"][path.as_str()][method.to_lowercase()]["x-paybus-role"] == "ADMIN";
        if method == "GET" && !admin_only {
            assert!(
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                "OPS reads {path}: {status} {body}"
            );
        } else {
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{method} {path} by OPS: {body}"
            );
        }
    }
}
