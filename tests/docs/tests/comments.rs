//! Comments say why the code is as it is now, and module docs stay short.
//!
//! - No dated note in a code comment: a date (`2026-12-05`) in a `//`, `///` or `//!` comment of
//!   a `src/` file tells history, which belongs in commit messages and the dated docs
//!   (docs/benchmarks.md). Not read: the test kit (`shared/testkit`),
//!   `#[cfg(test)]` modules, string literals, and a date inside a comment's inline code (`` ` ``),
//!   which quotes data (a path, a value) rather than telling when.
//! - No `//!` block over 15 lines in any `.rs` file, but the few in [`LONG_MODULE_DOCS`]; every
//!   crate's `src/lib.rs` opens with one.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use std::path::Path;

use paybus_docs::tree::{self, repository};

/// The most lines a `//!` block may have.
const MODULE_DOC_LINES: usize = 15;

/// Module docs allowed to be longer, each with why.
const LONG_MODULE_DOCS: &[(&str, &str)] = &[];

/// One comment: the text after its `//`, and its line (from 1).
#[derive(Debug, PartialEq, Eq)]
struct Comment {
    line: usize,
    text: String,
}

/// The `//` comments of `source` outside string and char literals and outside
/// `#[cfg(test)]` modules.
fn code_comments(source: &str) -> Vec<Comment> {
    let bytes = source.as_bytes();
    let mut comments = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Brace depth, and the depth at which a `#[cfg(test)]` module opened (skipped till it closes).
    let mut depth = 0usize;
    let mut test_module_at: Option<usize> = None;
    let mut test_attribute_seen = false;
    while i < bytes.len() {
        let rest = &source[i..];
        match bytes[i] {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if rest.starts_with("//") => {
                let end = rest.find('\n').unwrap_or(rest.len());
                if test_module_at.is_none() {
                    comments.push(Comment {
                        line,
                        text: rest[2..end].to_owned(),
                    });
                }
                i += end;
            }
            b'/' if rest.starts_with("/*") => {
                let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
                line += rest[..end].matches('\n').count();
                i += end;
            }
            b'r' | b'b' if raw_string_hashes(rest).is_some() => {
                let (opening, hashes) = raw_string_hashes(rest).unwrap_or_default();
                let closing = format!("\"{}", "#".repeat(hashes));
                let end = rest[opening..]
                    .find(&closing)
                    .map_or(rest.len(), |e| opening + e + closing.len());
                line += rest[..end].matches('\n').count();
                i += end;
            }
            b'"' => {
                let mut j = 1;
                while j < rest.len() && bytes[i + j] != b'"' {
                    j += if bytes[i + j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(rest.len());
                line += rest[..end].matches('\n').count();
                i += end;
            }
            b'\'' => i += char_literal_len(rest),
            b'#' if rest.starts_with("#[cfg(test)]") => {
                test_attribute_seen = true;
                i += "#[cfg(test)]".len();
            }
            b'{' => {
                if test_attribute_seen && test_module_at.is_none() {
                    test_module_at = Some(depth);
                }
                test_attribute_seen = false;
                depth += 1;
                i += 1;
            }
            b'}' => {
                depth = depth.saturating_sub(1);
                if test_module_at == Some(depth) {
                    test_module_at = None;
                }
                i += 1;
            }
            b';' => {
                // `#[cfg(test)] use …;` or `mod tests;`: the attribute's item ended.
                test_attribute_seen = false;
                i += 1;
            }
            _ => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    comments
}

/// `r"`, `r#"`, `br##"`…: the opening's length and its number of `#`.
fn raw_string_hashes(text: &str) -> Option<(usize, usize)> {
    let after_prefix = text.strip_prefix("br").or_else(|| text.strip_prefix('r'))?;
    let hashes = after_prefix.len() - after_prefix.trim_start_matches('#').len();
    after_prefix[hashes..]
        .starts_with('"')
        .then(|| (text.len() - after_prefix.len() + hashes + 1, hashes))
}

/// How far a `'` takes the reader: past a char literal (`'{'`, `'"'`, `'\''`), or one byte
/// for a lifetime (`'a`).
fn char_literal_len(text: &str) -> usize {
    let mut chars = text.char_indices().skip(1);
    match chars.next() {
        Some((_, '\\')) => text
            .get(3..)
            .and_then(|t| t.find('\''))
            .map_or(1, |end| end + 4),
        Some((_, c)) => match chars.next() {
            Some((at, '\'')) => at + 1,
            _ => 1 + c.len_utf8(),
        },
        None => 1,
    }
}

/// The first date (`20YY-MM-DD`) in `comment` outside its inline code.
fn dated(comment: &str) -> Option<&str> {
    comment
        .split('`')
        .step_by(2)
        .flat_map(|prose| prose.char_indices().map(move |(at, _)| &prose[at..]))
        .find_map(|text| {
            let date = text.get(..10)?;
            let b = date.as_bytes();
            let digits = |range: std::ops::Range<usize>| b[range].iter().all(u8::is_ascii_digit);
            (date.starts_with("20")
                && digits(2..4)
                && b[4] == b'-'
                && digits(5..7)
                && b[7] == b'-'
                && digits(8..10))
            .then_some(date)
        })
}

/// Whether `path` (relative to the repository) is code whose comments are read: under a
/// `src/` folder, and not the test kit.
fn is_code(path: &Path) -> bool {
    let parts: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.iter().any(|p| p == "src")
        && !parts.starts_with(&["shared".to_owned(), "testkit".to_owned()])
        && !parts.iter().any(|p| p == "vendor")
}

/// The `//!` blocks of `source` longer than [`MODULE_DOC_LINES`]: the line each starts on and
/// its length.
fn long_module_docs(source: &str) -> Vec<(usize, usize)> {
    let mut long = Vec::new();
    let mut start = 0;
    let mut run = 0;
    for (n, line) in source.lines().chain([""]).enumerate() {
        if line.trim_start().starts_with("//!") {
            if run == 0 {
                start = n + 1;
            }
            run += 1;
        } else {
            if run > MODULE_DOC_LINES {
                long.push((start, run));
            }
            run = 0;
        }
    }
    long
}

fn relative(file: &Path) -> std::path::PathBuf {
    file.strip_prefix(repository())
        .unwrap_or(file)
        .to_path_buf()
}

#[test]
fn no_code_comment_carries_a_date() {
    let mut read = 0;
    let mut found = Vec::new();
    for file in tree::files(&repository(), "rs").unwrap() {
        if !is_code(&relative(&file)) {
            continue;
        }
        read += 1;
        let source = std::fs::read_to_string(&file).unwrap();
        for comment in code_comments(&source) {
            if let Some(date) = dated(&comment.text) {
                found.push(format!(
                    "{}:{}: {date} in `//{}`",
                    tree::shown(&file),
                    comment.line,
                    comment.text
                ));
            }
        }
    }
    assert!(read > 200, "only {read} source files read");
    assert!(
        found.is_empty(),
        "a comment says why the code is as it is now; its history goes in the commit message \
         and the dated docs (quote a date that is data in `inline code`):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_module_doc_runs_over_15_lines() {
    let mut found = Vec::new();
    for file in tree::files(&repository(), "rs").unwrap() {
        let shown = tree::shown(&file);
        if LONG_MODULE_DOCS.iter().any(|(path, _)| *path == shown) {
            continue;
        }
        let source = std::fs::read_to_string(&file).unwrap();
        for (line, lines) in long_module_docs(&source) {
            found.push(format!("{shown}:{line}: {lines} lines"));
        }
    }
    assert!(
        found.is_empty(),
        "a module's `//!` says in at most {MODULE_DOC_LINES} lines what it is for, its rules and \
         the one non-obvious why; reference material goes in the docs page of its area:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_library_crate_says_what_it_is_for() {
    let mut silent = Vec::new();
    let mut crates = 0;
    for manifest in tree::files(&repository(), "toml").unwrap() {
        if manifest.file_name().is_none_or(|n| n != "Cargo.toml") {
            continue;
        }
        let root = manifest.with_file_name("src/lib.rs");
        let Ok(source) = std::fs::read_to_string(&root) else {
            continue;
        };
        crates += 1;
        if !source.trim_start().starts_with("//!") {
            silent.push(tree::shown(&root));
        }
    }
    assert!(crates > 20, "only {crates} library crates found");
    assert!(
        silent.is_empty(),
        "a crate's root opens with a `//!` saying what the crate is for and what it offers:\n{}",
        silent.join("\n")
    );
}

#[test]
fn a_date_in_a_comment_is_found_and_one_in_code_or_data_is_not() {
    let planted = r##"
//! The passes grew (the soak of 2026-12-05).
fn f() -> &'static str {
    let _brace = '{'; let _apostrophe = '\'';
    let _quote = '"'; // as until 2026-12-04
    let _raw = r#"2026-12-03 "quoted" // 2026-12-02"#;
    /// `POST /2018-06-01/runtime/init/error`, nothing else
    "2026-12-01 // 2026-11-30" // what a TIMESTAMP holds: `2038-01-19 03:14:07`
}
#[cfg(test)]
mod tests {
    // a soak of 2026-11-29 found {this}
    fn g() {}
}
// after the tests 2026-11-28
"##;
    let comments = code_comments(planted);
    let dates: Vec<(usize, &str)> = comments
        .iter()
        .filter_map(|c| dated(&c.text).map(|date| (c.line, date)))
        .collect();
    assert_eq!(
        dates,
        [(2, "2026-12-05"), (5, "2026-12-04"), (15, "2026-11-28")]
    );
}

#[test]
fn a_long_module_doc_is_found() {
    let sixteen = "//! line\n".repeat(16);
    let fifteen = "//! line\n".repeat(15);
    assert_eq!(
        long_module_docs(&format!("{sixteen}\nfn f() {{}}")),
        [(1, 16)]
    );
    assert!(long_module_docs(&format!("{fifteen}\nfn f() {{}}\n{fifteen}")).is_empty());
}
