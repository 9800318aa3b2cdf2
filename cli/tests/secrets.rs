//! The secrets at rest as operators handle them: `paybus migrate` seals plaintext partner
//! webhook secrets (and refuses without a key while any is left), `paybus secrets rotate-key`
//! has a real `paybus serve`, configured with the new key and the old one, re-seal the rows
//! under the old key with the new one.

use crate::api_process;

use api_process::{ApiProcess, output_of, paybus};
use paybus_testkit::{SECRETS_KEY, TestEnv};

const NEW_KEY: &str = "6e6577206b6579206f66207468652074657374732c2033322062797465732121";

/// `paybus <args>` on `env` with no secrets key but `keys`.
fn with_keys(env: &TestEnv, args: &[&str], keys: &[(&str, &str)]) -> std::process::Output {
    let mut command = paybus(env);
    command
        .args(args)
        .env_remove("PAYBUS_SECRETS_KEY")
        .env_remove("PAYBUS_SECRETS_OLD_KEYS");
    for (name, value) in keys {
        command.env(name, value);
    }
    output_of(&mut command)
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

async fn key_ids(env: &TestEnv) -> Vec<String> {
    sqlx::query_scalar("SELECT key_id FROM partner_webhook_secrets ORDER BY id")
        .fetch_all(&env.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn migrate_seals_plaintext_secrets_only_with_a_key_and_rotate_key_moves_them_to_the_new_one()
{
    let env = TestEnv::new().await;
    let nothing_to_seal = with_keys(&env, &["migrate"], &[]);
    sqlx::query(
        "INSERT INTO partners (name, webhook_secret) VALUES ('acme', 'acme-plaintext-secret-01'), \
         ('globex', 'globex-plaintext-secret-1')",
    )
    .execute(&env.db)
    .await
    .unwrap();

    let without_key = with_keys(&env, &["migrate"], &[]);
    let audit_before = with_keys(&env, &["audit"], &[]);
    let with_key = with_keys(&env, &["migrate"], &[("PAYBUS_SECRETS_KEY", SECRETS_KEY)]);
    let audit_after = with_keys(&env, &["audit"], &[]);

    assert!(
        nothing_to_seal.status.success(),
        "{}",
        text(&nothing_to_seal)
    );
    assert!(!without_key.status.success());
    assert!(
        text(&without_key).contains("PAYBUS_SECRETS_KEY"),
        "{}",
        text(&without_key)
    );
    assert!(text(&audit_before).contains("partner_secrets_sealed"));
    assert!(with_key.status.success(), "{}", text(&with_key));
    assert!(text(&with_key).contains("partner webhook secrets sealed: 2"));
    assert!(audit_after.status.success(), "{}", text(&audit_after));
    let old_ids = key_ids(&env).await;
    assert_eq!(old_ids.len(), 2);

    let Some(rotating) = ApiProcess::with_provider(
        &env,
        &[
            ("PAYBUS_SECRETS_KEY", Some(NEW_KEY)),
            ("PAYBUS_SECRETS_OLD_KEYS", Some(SECRETS_KEY)),
        ],
    )
    .await
    else {
        return;
    };
    let rotate = || {
        rotating
            .cli_as(&env, "alice")
            .args(["secrets", "rotate-key"])
            .output()
            .unwrap()
    };
    let first = rotate();
    let second = rotate();
    drop(rotating);
    // An API given the old key alone, after the rows moved to the new one.
    let Some(old_key_only) = ApiProcess::with_provider(
        &env,
        &[
            ("PAYBUS_SECRETS_KEY", Some(SECRETS_KEY)),
            ("PAYBUS_SECRETS_OLD_KEYS", None),
        ],
    )
    .await
    else {
        return;
    };
    let new_only = old_key_only
        .cli_as(&env, "alice")
        .args(["secrets", "rotate-key"])
        .output()
        .unwrap();

    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains(": 2 row(s) (0 re-sealed"),
        "{}",
        text(&first)
    );
    assert!(text(&second).contains(": 0 row(s)"), "{}", text(&second));
    let logged: Vec<(String, String)> = sqlx::query_as(
        "SELECT actor, subject FROM ops_log WHERE action = 'secrets.rotate_key' ORDER BY seq",
    )
    .fetch_all(&env.db)
    .await
    .unwrap();
    assert_eq!(logged.len(), 2, "one row a run: {logged:?}");
    assert!(
        logged
            .iter()
            .all(|(actor, subject)| actor == "alice@example.com"
                && subject.starts_with("secrets_key:")),
        "{logged:?}"
    );
    let new_ids = key_ids(&env).await;
    assert!(
        new_ids
            .iter()
            .all(|id| id == &new_ids[0] && !old_ids.contains(id))
    );
    // Without the key that sealed them, the rows cannot be re-sealed: a clear failure.
    assert_eq!(new_only.status.code(), Some(1));
    assert!(
        text(&new_only).contains("409 Conflict"),
        "{}",
        text(&new_only)
    );
    assert!(
        text(&new_only).contains("neither PAYBUS_SECRETS_KEY nor one of PAYBUS_SECRETS_OLD_KEYS"),
        "{}",
        text(&new_only)
    );
}
