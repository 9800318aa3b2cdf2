//! `GET /v1/admin/search` and the console's search: a tx hash or an id, as support has it,
//! lands on the trace of what it names. Rows made through the admin API.

use crate::support;

use axum::{
    body::Body,
    http::{Request, StatusCode, header},
};
use paybus_api::role::Role;
use serde_json::json;
use support::{Api, admin_get, admin_post, console_cookie};
use tower::ServiceExt;

const TX: &str = "0x5ea2c4f00d";

#[tokio::test]
async fn a_tx_hash_or_an_id_lands_on_the_trace_of_what_it_names() {
    let api = Api::new().await;
    let (_, partner) = api
        .call(admin_post(
            "/v1/admin/partners",
            &json!({"name": "Searched", "webhook_url": "http://127.0.0.1:9/hooks",
                    "webhook_secret": "searched-partner-signing-secret"}),
        ))
        .await;
    let (status, withdrawal) = api
        .call(admin_post(
            "/v1/admin/withdrawals",
            &json!({"partner_id": partner["id"], "kind": "NORMAL", "status": "BROADCASTING",
                    "currency": "USDT", "amount": "5", "to_address": "T-search", "tx_hash": TX}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{withdrawal}");
    let withdrawal = withdrawal["id"].as_u64().unwrap();

    let (status, found) = api
        .call(admin_get(&format!("/v1/admin/search?q={TX}")))
        .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found["matches"].as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found["matches"][0]["kind"], "withdrawal");
    assert_eq!(found["matches"][0]["id"], withdrawal);
    assert!(
        found["notes"][0].as_str().unwrap().contains("partner=ID"),
        "an order reference needs its partner: {found}"
    );
    let (_, by_id) = api
        .call(admin_get(&format!("/v1/admin/search?q={withdrawal}")))
        .await;
    assert!(
        by_id["matches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["kind"] == "withdrawal" && m["id"] == withdrawal),
        "{by_id}"
    );
    let (_, nothing) = api.call(admin_get("/v1/admin/search?q=0xnothing")).await;
    assert_eq!(nothing["matches"], json!([]));
    for bad in ["/v1/admin/search?q=%20", "/v1/admin/search"] {
        let (status, refused) = api.call(admin_get(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {refused}");
    }

    // The console: one match goes straight to its trace.
    let cookie = console_cookie(&api, &[Role::Ops]).await;
    let searched = api
        .router()
        .oneshot(
            Request::get(format!("/console/search?q={TX}"))
                .header(header::COOKIE, &cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(searched.status(), StatusCode::SEE_OTHER);
    let trace = searched.headers()[header::LOCATION]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        trace,
        format!("/console/trace?kind=withdrawal&id={withdrawal}")
    );
    let page = api
        .router()
        .oneshot(
            Request::get(&trace)
                .header(header::COOKIE, &cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = String::from_utf8(
        axum::body::to_bytes(page.into_body(), 1 << 22)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    assert!(html.contains("T-search") || html.contains(TX), "{html}");
}
