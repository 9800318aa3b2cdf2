//! No crate's sibling modules import each other in a circle: in every crate root of the
//! repository (`src/lib.rs`, `src/main.rs`, each `src/bin` binary), a module that names its
//! sibling is never named back by it, directly or around a longer circle. A circle means the
//! two are one concern split in two files, or one of them holds what belongs to a third: move
//! the shared type down to the lower module or into a small module both use (a `pub use` that
//! keeps the path is still the same dependency, and the check sees through it). How the graph
//! is read: [`paybus_docs::modules`].
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::path::{Path, PathBuf};

use paybus_docs::{
    modules::{Cycle, ModuleGraph},
    tree::{self, repository},
};

/// Crates whose cycles are not reported yet, each with why; an entry that finds no cycle any
/// more fails, so it goes when its reason does.
const ALLOWED: &[(&str, &str)] = &[];

/// How many places of an edge a failure message quotes.
const PLACES_SHOWN: usize = 3;

/// Every crate root under `dir`: each `Cargo.toml`'s `src/lib.rs`, `src/main.rs`, and each
/// binary of its `src/bin` (a file or a folder with a `main.rs`).
fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for manifest in tree::files(dir, "toml").unwrap() {
        if manifest.file_name().is_none_or(|n| n != "Cargo.toml") {
            continue;
        }
        let src = manifest.with_file_name("src");
        roots.extend(
            [src.join("lib.rs"), src.join("main.rs")]
                .into_iter()
                .filter(|root| root.is_file()),
        );
        let Ok(bins) = std::fs::read_dir(src.join("bin")) else {
            continue;
        };
        let mut bins: Vec<PathBuf> = bins
            .map(|entry| entry.unwrap().path())
            .filter_map(|path| {
                if path.is_dir() {
                    Some(path.join("main.rs")).filter(|main| main.is_file())
                } else {
                    path.extension().is_some_and(|e| e == "rs").then_some(path)
                }
            })
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
}

/// The failure message's lines for the cycles of one crate root.
fn describe(root: &str, cycles: &[Cycle]) -> Vec<String> {
    let mut lines = Vec::new();
    for cycle in cycles {
        lines.push(format!("{root}: {}", cycle.modules.join(" → ")));
        for edge in &cycle.edges {
            let places: Vec<String> = edge
                .references
                .iter()
                .take(PLACES_SHOWN)
                .map(|r| format!("{}:{} `{}`", tree::shown(&r.file), r.line, r.path))
                .collect();
            let more = edge.references.len().saturating_sub(PLACES_SHOWN);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            lines.push(format!(
                "    {} → {}: {}{more}",
                edge.from,
                edge.to,
                places.join(", ")
            ));
        }
    }
    lines
}

#[test]
fn no_crate_has_sibling_modules_that_import_each_other() {
    let repository = repository();
    let roots = crate_roots(&repository);
    let mut found = Vec::new();
    let mut allowed_with_cycles = Vec::new();
    for root in &roots {
        let shown = tree::shown(root);
        let cycles = ModuleGraph::read(root).unwrap().cycles();
        if let Some((crate_dir, _)) = ALLOWED
            .iter()
            .find(|(crate_dir, _)| shown.starts_with(&format!("{crate_dir}/")))
        {
            if !cycles.is_empty() {
                allowed_with_cycles.push(*crate_dir);
            }
            continue;
        }
        found.extend(describe(&shown, &cycles));
    }
    assert!(roots.len() > 30, "only {} crate roots found", roots.len());
    assert!(
        found.is_empty(),
        "sibling modules import each other in a circle (each edge: where the first names the \
         second); move what both need down into the lower one or into a small module both \
         use:\n{}",
        found.join("\n")
    );
    let stale: Vec<&str> = ALLOWED
        .iter()
        .map(|(crate_dir, _)| *crate_dir)
        .filter(|crate_dir| !allowed_with_cycles.contains(crate_dir))
        .collect();
    assert!(
        stale.is_empty(),
        "no cycle left in {stale:?}: remove its entry from ALLOWED"
    );
}

/// A throwaway crate's `src/` folder with `files` (path, text) in it, removed on drop.
struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new(name: &str, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "paybus-module-cycles-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let file = dir.join("src").join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        Fixture { dir }
    }

    fn cycles(&self) -> Vec<Cycle> {
        ModuleGraph::read(&self.dir.join("src/lib.rs"))
            .unwrap()
            .cycles()
    }

    /// Each cycle's edges as `from → to: file:line path`, the file relative to `src/`.
    fn edges(&self) -> Vec<String> {
        let src = self.dir.join("src");
        self.cycles()
            .iter()
            .flat_map(|cycle| &cycle.edges)
            .flat_map(|edge| {
                edge.references.iter().map(|r| {
                    let file = r.file.strip_prefix(&src).unwrap().display();
                    format!("{} → {}: {file}:{} {}", edge.from, edge.to, r.line, r.path)
                })
            })
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_planted_cycle_is_found_with_both_edges() {
    let fixture = Fixture::new(
        "planted",
        &[
            ("lib.rs", "mod ledger;\nmod posting;\n"),
            (
                "ledger.rs",
                "use crate::posting::Posting;\npub struct Ledger(Vec<Posting>);\n",
            ),
            (
                "posting.rs",
                "pub struct Posting;\n\
                 impl Posting {\n    pub fn into_ledger(self) -> super::ledger::Ledger {\n        todo!()\n    }\n}\n",
            ),
        ],
    );

    let cycles = fixture.cycles();

    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert_eq!(cycles[0].modules, ["ledger", "posting", "ledger"]);
    assert_eq!(
        fixture.edges(),
        [
            "ledger → posting: ledger.rs:1 crate::posting::Posting",
            "posting → ledger: posting.rs:3 super::ledger::Ledger",
        ]
    );
    let message = describe("fixture/src/lib.rs", &cycles).join("\n");
    assert!(
        message.contains("fixture/src/lib.rs: ledger → posting → ledger")
            && message.contains("posting.rs:3 `super::ledger::Ledger`"),
        "{message}"
    );
}

#[test]
fn a_cycle_through_a_reexport_or_a_nested_level_is_found_and_test_code_is_not_read() {
    let fixture = Fixture::new(
        "indirect",
        &[
            (
                "lib.rs",
                "mod chaos;\nmod report;\npub use report::Summary;\n",
            ),
            // `crate::Summary` is report's, re-exported at the root: still chaos → report.
            (
                "chaos/mod.rs",
                "mod checks;\nmod load;\npub fn run() -> crate::Summary { todo!() }\n",
            ),
            (
                "chaos/checks.rs",
                "pub fn check() { super::load::start(); }\n",
            ),
            // A macro's argument and a serde string name a sibling too.
            (
                "chaos/load.rs",
                "pub fn start() { let _ = format!(\"{}\", super::checks::check()); }\n\
                 #[derive(serde::Serialize)]\n\
                 struct Row { #[serde(serialize_with = \"crate::chaos::checks::seconds\")] at: u64 }\n",
            ),
            (
                "report.rs",
                "pub struct Summary;\n\
                 pub fn of(_: crate::chaos::Run) {}\n\
                 #[cfg(test)]\nmod tests { use crate::chaos::checks; }\n\
                 #[cfg(test)]\nfn helper() { crate::chaos::run(); }\n",
            ),
        ],
    );

    assert_eq!(
        fixture.edges(),
        [
            "chaos → report: chaos/mod.rs:3 crate::Summary",
            "report → chaos: report.rs:2 crate::chaos::Run",
            "chaos::checks → chaos::load: chaos/checks.rs:1 super::load::start",
            "chaos::load → chaos::checks: chaos/load.rs:1 super::checks::check",
            "chaos::load → chaos::checks: chaos/load.rs:3 crate::chaos::checks::seconds",
        ]
    );
}

#[test]
fn references_to_ancestors_and_descendants_are_not_edges() {
    let fixture = Fixture::new(
        "tree",
        &[
            ("lib.rs", "mod bus;\npub struct Settings;\n"),
            (
                "bus.rs",
                "mod consumer;\nuse consumer::Consumer;\npub fn settings() -> crate::Settings { todo!() }\n",
            ),
            (
                "bus/consumer.rs",
                "pub struct Consumer(crate::Settings);\npub fn bus() { super::settings(); }\n",
            ),
        ],
    );

    assert!(fixture.cycles().is_empty(), "{:?}", fixture.cycles());
}
