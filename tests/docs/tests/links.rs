//! Every relative link in README.md, CHANGELOG.md, `docs/` and the infra READMEs resolves to a
//! file, and every `#anchor` to a heading of the page it names: a page moved or a heading
//! renamed fails here, not in a reader's browser.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::path::{Path, PathBuf};

use paybus_docs::{
    page::Page,
    tree::{self, repository},
};

/// The pages whose links are checked.
fn pages() -> Vec<PathBuf> {
    let root = repository();
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    pages.extend(tree::files(&root.join("docs"), "md").unwrap());
    pages.extend(
        tree::files(&root.join("infra"), "md")
            .unwrap()
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n == "README.md")),
    );
    pages
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// Why `target`, a link on `page`, does not resolve; `None` when it does.
fn broken(page: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap().join(path)
    };
    if !file.exists() {
        return Some(format!("{} does not exist", tree::shown(&file)));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "#{anchor} points into {}, which has no headings",
            tree::shown(&file)
        ));
    }
    let anchors = Page::parse(&std::fs::read_to_string(&file).unwrap()).anchors();
    (!anchors.contains(anchor)).then(|| {
        format!(
            "{} has no heading whose anchor is #{anchor}",
            tree::shown(&file)
        )
    })
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let parsed = Page::parse(&std::fs::read_to_string(&page).unwrap());
        for link in parsed.links.iter().filter(|l| !is_external(&l.target)) {
            checked += 1;
            if let Some(why) = broken(&page, &link.target) {
                problems.push(format!(
                    "{}:{}: ({}) {why}",
                    tree::shown(&page),
                    link.line,
                    link.target
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the docs folder there?"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_stays_a_front_door() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move the detail into docs/"
    );
}

#[test]
fn every_alert_names_a_runbook_section_that_exists() {
    let rules = std::fs::read_to_string(repository().join("infra/prometheus/alerts.yml")).unwrap();
    let runbooks: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("runbook: "))
        .collect();
    let alerts = rules
        .lines()
        .filter(|l| l.trim().starts_with("- alert: "))
        .count();
    assert_eq!(runbooks.len(), alerts, "every alert has a runbook");
    let broken: Vec<String> = runbooks
        .iter()
        .filter_map(|target| broken(&repository().join("README.md"), target))
        .collect();
    assert!(broken.is_empty(), "{broken:?}");
}
