//! CHANGELOG.md as a tool reads it (`paybus_docs::changelog`): its newest section is the
//! workspace's version, every release has upgrade notes, and each cut release's commit is in
//! this repository's history, so an upgrade test can check out the previous release by it.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::process::{Command, Output};

use paybus_docs::{
    changelog::{self, Release},
    tree::repository,
};

fn releases() -> Vec<Release> {
    let text = std::fs::read_to_string(repository().join("CHANGELOG.md")).unwrap();
    changelog::parse(&text).unwrap_or_else(|error| panic!("CHANGELOG.md: {error}"))
}

fn git(args: &[&str]) -> Output {
    Command::new("git")
        .args(args)
        .current_dir(repository())
        .output()
        .unwrap()
}

#[test]
fn the_newest_release_is_the_workspaces_version_and_each_has_upgrade_notes() {
    let releases = releases();
    assert_eq!(
        releases.first().map(|r| r.version.as_str()),
        Some(env!("CARGO_PKG_VERSION")),
        "CHANGELOG.md's newest section is not the workspace's version ([workspace.package] \
         version in Cargo.toml)"
    );
    for release in &releases {
        assert!(
            release.headings.iter().any(|h| h == "Upgrade notes"),
            "{} has no `### Upgrade notes`",
            release.version
        );
    }
}

#[test]
fn the_previous_release_and_every_cut_one_name_a_commit_of_this_history() {
    let releases = releases();
    let previous = changelog::previous(&releases, env!("CARGO_PKG_VERSION"))
        .expect("a release before this one");
    assert!(previous.commit.is_some(), "{previous:?} is not cut");
    let shallow = git(&["rev-parse", "--is-shallow-repository"]);
    if !shallow.status.success() || shallow.stdout.starts_with(b"true") {
        eprintln!("skipped: not a full git clone, so older commits may be missing");
        return;
    }
    for release in &releases {
        let Some(commit) = &release.commit else {
            continue;
        };
        let ancestor = git(&["merge-base", "--is-ancestor", commit, "HEAD"]);
        assert!(
            ancestor.status.success(),
            "{}'s commit {commit} is not in HEAD's history: {ancestor:?}",
            release.version
        );
    }
}
