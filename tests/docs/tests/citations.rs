//! Every `seed 00N §x` and `principle N` the code cites names a page: a seed and one of its
//! sections in docs/seeds.md, a principle in docs/principles.md. A citation of a section the
//! docs do not have (a typo, a renumbered seed) fails here.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::collections::BTreeSet;

use paybus_docs::{
    page::Page,
    tree::{self, repository},
};

/// One citation as written, and where.
#[derive(Debug)]
struct Citation {
    cited: String,
    at: String,
}

/// The headings of a docs page that start with `prefix` (`Seed `, `Principle `), each up to its
/// colon: `Seed 001 §4-3`, `Principle 7`.
fn cited_headings(page: &str, prefix: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repository().join(page)).unwrap();
    Page::parse(&text)
        .headings
        .into_iter()
        .filter(|heading| heading.starts_with(prefix))
        .map(|heading| heading.split(':').next().unwrap_or_default().to_owned())
        .collect()
}

/// The number at the start of `text`: all of its digits, when there are `digits` of them (any
/// count, at least one, for `None`).
fn number(text: &str, digits: Option<usize>) -> Option<&str> {
    let end = text
        .char_indices()
        .find(|(_, c)| !c.is_ascii_digit())
        .map_or(text.len(), |(i, _)| i);
    (end > 0 && digits.is_none_or(|digits| end == digits)).then(|| &text[..end])
}

/// The sections after a seed's number: `§0`, `§3.3`, `§4-2, §4-4`, `§3–§5`, `§0 ②`.
fn sections(mut rest: &str) -> Vec<String> {
    let mut found = Vec::new();
    loop {
        let Some(after) = rest.trim_start_matches(' ').strip_prefix('§') else {
            return found;
        };
        let token: String = after
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
            .collect();
        let token = token.trim_end_matches(['.', '-']).to_owned();
        if token.is_empty() {
            return found;
        }
        rest = &after[token.len()..];
        found.push(token);
        // A step marker (`§0 ②`) belongs to the section before it.
        rest = rest.trim_start_matches(|c: char| c == ' ' || ('①'..='⑳').contains(&c));
        match [", §", "–§", "-§", " and §"]
            .iter()
            .find_map(|separator| rest.strip_prefix(&separator[..separator.len() - '§'.len_utf8()]))
        {
            Some(next) => rest = next,
            None => return found,
        }
    }
}

/// Every `seed NNN [§x …]` and `principle N [and M]` in the Rust sources outside `vendor/`.
fn citations() -> (Vec<Citation>, Vec<Citation>) {
    let mut seeds = Vec::new();
    let mut principles = Vec::new();
    for file in tree::files(&repository(), "rs").unwrap() {
        let text = std::fs::read_to_string(&file).unwrap();
        let lower = text.to_ascii_lowercase();
        let at = |offset: usize| {
            format!(
                "{}:{}",
                tree::shown(&file),
                text[..offset].matches('\n').count() + 1
            )
        };
        for (offset, _) in lower.match_indices("seed ") {
            let rest = &text[offset + "seed ".len()..];
            let Some(seed) = number(rest, Some(3)) else {
                continue;
            };
            seeds.push(Citation {
                cited: format!("Seed {seed}"),
                at: at(offset),
            });
            for section in sections(&rest[seed.len()..]) {
                seeds.push(Citation {
                    cited: format!("Seed {seed} §{section}"),
                    at: at(offset),
                });
            }
        }
        for prefix in ["principle ", "principles "] {
            for (offset, _) in lower.match_indices(prefix) {
                let mut rest = &text[offset + prefix.len()..];
                while let Some(n) = number(rest, None) {
                    principles.push(Citation {
                        cited: format!("Principle {n}"),
                        at: at(offset),
                    });
                    rest = &rest[n.len()..];
                    match [" and ", ", "].iter().find_map(|s| rest.strip_prefix(s)) {
                        Some(next) => rest = next,
                        None => break,
                    }
                }
            }
        }
    }
    (seeds, principles)
}

fn missing(citations: &[Citation], known: &BTreeSet<String>) -> Vec<String> {
    citations
        .iter()
        .filter(|c| !known.contains(&c.cited))
        .map(|c| format!("{}: {}", c.at, c.cited))
        .collect()
}

#[test]
fn every_seed_section_the_code_cites_is_in_docs_seeds() {
    let (seeds, _) = citations();
    assert!(
        seeds.len() > 50,
        "only {} seed citations found",
        seeds.len()
    );
    let known = cited_headings("docs/seeds.md", "Seed ");
    let missing = missing(&seeds, &known);
    assert!(
        missing.is_empty(),
        "cited, but docs/seeds.md has no `### Seed 00N §x: …` heading for it:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_principle_the_code_cites_is_in_docs_principles() {
    let (_, principles) = citations();
    assert!(
        principles.len() > 20,
        "only {} principle citations found",
        principles.len()
    );
    let known = cited_headings("docs/principles.md", "Principle ");
    let expected: BTreeSet<String> = (1..=13).map(|n| format!("Principle {n}")).collect();
    assert_eq!(
        known, expected,
        "docs/principles.md must state the thirteen principles"
    );
    let missing = missing(&principles, &known);
    assert!(
        missing.is_empty(),
        "cited, but not a principle:\n{}",
        missing.join("\n")
    );
}

#[test]
fn section_lists_are_read_as_the_code_writes_them() {
    assert_eq!(sections(" §0 ②, the"), ["0"]);
    assert_eq!(sections(" §3.3: x"), ["3.3"]);
    assert_eq!(sections(" §4-2, §4-4, §4-5): x"), ["4-2", "4-4", "4-5"]);
    assert_eq!(sections(" §3–§5): x"), ["3", "5"]);
    assert_eq!(sections(" §7."), ["7"]);
    assert_eq!(sections("): x"), Vec::<String>::new());
}

/// Each line of the Rust sources (outside `vendor/`) with where it is.
fn source_lines() -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for file in tree::files(&repository(), "rs").unwrap() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            lines.push((format!("{}:{}", tree::shown(&file), n + 1), line.to_owned()));
        }
    }
    lines
}

/// Every `docs/….md` path in `line`.
fn docs_paths(line: &str) -> Vec<&str> {
    line.match_indices("docs/")
        .filter_map(|(start, _)| {
            let rest = &line[start..];
            let end = rest.find(".md")? + ".md".len();
            let path = &rest[..end];
            path.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c))
                .then_some(path)
        })
        .collect()
}

#[test]
fn the_code_cites_documents_that_are_in_the_repository() {
    // The specification and the issue tracker are not: a reader of the code cannot follow
    // `SPEC §3` or `issue 14`. (The migrations keep theirs, since their text is checksummed;
    // docs/principles.md maps them.)
    let cited_elsewhere: Vec<String> = source_lines()
        .into_iter()
        // This check names what it looks for.
        .filter(|(at, _)| !at.starts_with("tests/docs/"))
        .filter(|(_, line)| {
            let words: Vec<&str> = line.split(|c: char| !c.is_alphanumeric()).collect();
            words.windows(2).any(|pair| {
                pair[0] == "SPEC"
                    || (pair[0] == "issue"
                        && pair[1].chars().all(|c| c.is_ascii_digit())
                        && !pair[1].is_empty())
            })
        })
        .map(|(at, line)| format!("{at}: {}", line.trim()))
        .collect();
    assert!(
        cited_elsewhere.is_empty(),
        "cite a docs page, a principle or a seed instead:\n{}",
        cited_elsewhere.join("\n")
    );

    let mut named = 0;
    let missing: Vec<String> = source_lines()
        .into_iter()
        .flat_map(|(at, line)| {
            docs_paths(&line)
                .into_iter()
                .map(|path| (at.clone(), path.to_owned()))
                .collect::<Vec<_>>()
        })
        .inspect(|_| named += 1)
        .filter(|(_, path)| !repository().join(path).exists())
        .map(|(at, path)| format!("{at}: {path}"))
        .collect();
    assert!(named > 20, "only {named} docs pages named in the code");
    assert!(
        missing.is_empty(),
        "the code names docs pages that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn docs_paths_are_read_out_of_a_line() {
    assert_eq!(
        docs_paths("//! (docs/workflows/p2p.md, seed 000) and docs/bus.md."),
        ["docs/workflows/p2p.md", "docs/bus.md"]
    );
    assert_eq!(
        docs_paths("see docs/ and the README.md"),
        Vec::<&str>::new()
    );
}
