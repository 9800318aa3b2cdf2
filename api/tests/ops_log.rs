//! `GET /v1/admin/ops-log` through the router: OPS read the log newest first in pages, a bad
//! query is a 400 naming what is wrong, and a row edited by hand shows in `GET /v1/admin/audit`.

use crate::support;

use axum::http::StatusCode;
use paybus_api::role::Role;
use paybus_ops::ops_log::{self, Entry};
use serde_json::json;
use support::*;

async fn append(api: &Api, count: u64) {
    let mut tx = api.env.db.begin().await.unwrap();
    for n in 1..=count {
        ops_log::append(
            &mut tx,
            &Entry {
                actor: &paybus_testkit::person("alice"),
                action: "function.pause",
                subject: &format!("function:f{n}"),
                detail: &json!({ "n": n }),
            },
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

fn seqs(page: &serde_json::Value) -> Vec<u64> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn ops_read_the_log_newest_first_a_page_at_a_time() {
    let api = Api::new().await;
    append(&api, 5).await;

    let (status, first) = api
        .call(with_roles("GET", "/v1/admin/ops-log?limit=2", &[Role::Ops]))
        .await;
    let (_, second) = api
        .call(with_roles(
            "GET",
            "/v1/admin/ops-log?limit=2&before_seq=4",
            &[Role::Ops],
        ))
        .await;
    let (_, last) = api
        .call(with_roles(
            "GET",
            "/v1/admin/ops-log?before_seq=2",
            &[Role::Ops],
        ))
        .await;

    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(seqs(&first), [5, 4]);
    assert_eq!(first["next_before_seq"], 4);
    assert_eq!(seqs(&second), [3, 2]);
    assert_eq!(seqs(&last), [1]);
    assert_eq!(last["next_before_seq"], serde_json::Value::Null);
    let entry = &first["entries"][0];
    assert_eq!(entry["actor"], "alice");
    assert_eq!(entry["action"], "function.pause");
    assert_eq!(entry["subject"], "function:f5");
    assert_eq!(entry["detail"], json!({"n": 5}));
    assert_eq!(entry["prev_hash"], first["entries"][1]["row_hash"]);
}

#[tokio::test]
async fn a_bad_page_query_is_a_400_never_a_500() {
    let api = Api::new().await;
    for (query, expected) in [
        ("before_seq=0", "before_seq must be a positive integer"),
        ("before_seq=-1", "before_seq"),
        ("before_seq=x", "before_seq"),
        ("before_seq=18446744073709551616", "before_seq"),
        ("limit=0", "limit must be from 1 to 500"),
        ("limit=501", "limit must be from 1 to 500"),
        ("limit=4294967296", "limit"),
        ("after_seq=3", "unknown field"),
    ] {
        let (status, body) = api
            .call(admin_get(&format!("/v1/admin/ops-log?{query}")))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(error_of(&body).contains(expected), "{query}: {body}");
    }
}

#[tokio::test]
async fn a_row_edited_by_hand_is_a_violation_in_the_audit() {
    let api = Api::new().await;
    append(&api, 3).await;
    let (_, clean) = api.call(admin_get("/v1/admin/audit")).await;
    assert_eq!(clean["clean"], true, "{clean}");

    sqlx::query("UPDATE ops_log SET actor = 'mallory' WHERE seq = 2")
        .execute(&api.env.db)
        .await
        .unwrap();
    let (status, dirty) = api.call(admin_get("/v1/admin/audit")).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        dirty["violations"],
        json!([{
            "check": "ops_log_chain",
            "description": "ops_log_chain: row 2's content does not match its hash (changed after it was written)",
            "seq": 2,
            "problem": "changed",
        }])
    );
}
