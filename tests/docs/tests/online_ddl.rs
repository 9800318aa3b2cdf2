//! Migrations change hot tables online. Every `ALTER TABLE`, `CREATE INDEX` and `DROP INDEX`
//! in `migrations/` names how MySQL must make it: `ALGORITHM=INSTANT` (alone: MySQL 8 refuses
//! a `LOCK` beside it), or `ALGORITHM=INPLACE, LOCK=NONE`. MySQL and MariaDB then refuse a
//! change they cannot make without blocking writes, at the deploy, instead of quietly locking a
//! table money moves through while it copies. The migrations applied before this rule keep
//! their text ([`BEFORE_THE_RULE`]): an applied migration is never edited (sqlx checks each
//! one's checksum).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_docs::tree::{files, repository};

/// Applied before the rule, unchanged since.
const BEFORE_THE_RULE: &[&str] = &[
    "20261130000108_partner_notifications_republished_at.sql",
    "20261130000109_partner_webhook_breaker.sql",
    "20261130000504_ledger_entries_recent.sql",
    "20261130000505_deposits_recent.sql",
    "20261130000506_p2p_withdraw_orders_recent.sql",
    "20261130000507_p2p_deposit_orders_recent.sql",
    "20261130000508_p2p_matches_recent.sql",
    "20261130000509_members_recent.sql",
    "20261130000510_charges_recent.sql",
    "20261130000511_charge_event_job_recent.sql",
    "20261130000512_tasks_recent.sql",
    "20261201000201_p2p_trades_in_doubt.sql",
    "20261202000102_partner_webhook_secrets.sql",
    "20261202000103_partner_webhook_disabled.sql",
    "20261202000104_partner_notification_attempts.sql",
    "20261202000105_partner_api_keys.sql",
    "20261202000204_p2p_idempotency_keys.sql",
    "20261202000513_dead_letter_failures.sql",
    "20261202000522_dead_letter_operations.sql",
    "20261202000523_dead_letter_failures_recent.sql",
    "20261202000525_trace_lookups.sql",
    "20261202000701_outbox_trace_context.sql",
    "20261202000801_dead_letters_shard_key.sql",
    "20261202000802_dead_letters_groups.sql",
    "20261202000803_dead_letters_new_in_order.sql",
    "20261202000804_charge_event_job_stuck_claims.sql",
    "20261205000001_charge_event_job_member_event.sql",
    "20261205000004_charges_above_checkpoint.sql",
    "20261205000005_ledger_entries_recent_covering.sql",
];

/// The statements of a migration, comments removed and whitespace collapsed, upper-cased.
fn statements(sql: &str) -> Vec<String> {
    let mut text = String::new();
    let mut rest = sql;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, next)| next);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, next)| next);
        } else if rest.starts_with('\'') {
            // A quoted value is kept whole: a `;` or `--` inside it is data.
            let end = rest[1..].find('\'').map_or(rest.len(), |i| i + 2);
            text.push_str(&rest[..end]);
            rest = &rest[end..];
        } else {
            let c = rest.chars().next().unwrap();
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    text.split(';')
        .map(|s| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// Why `statement` would change a table offline, if it would.
fn offline(statement: &str) -> Option<&'static str> {
    let changes_a_table = [
        "ALTER TABLE ",
        "CREATE INDEX ",
        "CREATE UNIQUE INDEX ",
        "DROP INDEX ",
    ]
    .iter()
    .any(|start| statement.starts_with(start));
    if !changes_a_table {
        return None;
    }
    let compact: String = statement.chars().filter(|c| !c.is_whitespace()).collect();
    let instant = compact.contains("ALGORITHM=INSTANT");
    let inplace = compact.contains("ALGORITHM=INPLACE");
    let lock_none = compact.contains("LOCK=NONE");
    let any_lock = compact.contains("LOCK=");
    match (instant, inplace) {
        (true, _) if any_lock => Some("MySQL 8 refuses a LOCK beside ALGORITHM=INSTANT"),
        (true, _) => None,
        (false, true) if lock_none => None,
        (false, true) => Some("ALGORITHM=INPLACE without LOCK=NONE may block writes"),
        (false, false) => Some("names no ALGORITHM: the server may copy the table under a lock"),
    }
}

/// Each offline change in `sql`: the statement's start and why.
fn offline_changes(sql: &str) -> Vec<String> {
    statements(sql)
        .iter()
        .filter_map(|s| offline(s).map(|why| format!("{}…: {why}", &s[..s.len().min(70)])))
        .collect()
}

#[test]
fn every_migration_changes_its_tables_online() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in files(&repository().join("migrations"), "sql").unwrap() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let changes = offline_changes(&std::fs::read_to_string(&path).unwrap());
        if BEFORE_THE_RULE.contains(&name.as_str()) {
            assert!(
                !changes.is_empty(),
                "{name} is listed as applied before the rule but changes its tables online: \
                 take it off the list"
            );
            continue;
        }
        checked += 1;
        failures.extend(
            changes
                .into_iter()
                .map(|change| format!("{name}: {change}")),
        );
    }
    assert!(checked > 0, "no migration read");
    assert!(
        failures.is_empty(),
        "offline schema changes:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_planted_offline_alter_is_found_and_the_online_forms_are_not() {
    let planted =
        "-- a column; with a comment\nALTER TABLE withdrawals ADD COLUMN note VARCHAR(20) NULL;";
    assert_eq!(offline_changes(planted).len(), 1, "{planted}");
    assert_eq!(
        offline_changes("CREATE INDEX ix_w ON withdrawals (status) ALGORITHM=INPLACE;").len(),
        1,
        "INPLACE without LOCK=NONE"
    );
    assert_eq!(
        offline_changes("ALTER TABLE w ADD COLUMN n INT NULL, ALGORITHM=INSTANT, LOCK=NONE").len(),
        1,
        "LOCK beside INSTANT"
    );
    for online in [
        "ALTER TABLE withdrawals ADD COLUMN note VARCHAR(20) NULL, ALGORITHM=INSTANT;",
        "alter table withdrawals add index ix_note (note), algorithm = inplace, lock = none",
        "CREATE INDEX ix_w ON withdrawals (status) ALGORITHM=INPLACE LOCK=NONE",
        "CREATE TABLE t (id INT PRIMARY KEY); INSERT INTO t VALUES (1)",
        "INSERT INTO notes (text) VALUES ('ALTER TABLE x; -- not a statement')",
    ] {
        assert_eq!(offline_changes(online), Vec::<String>::new(), "{online}");
    }
}
