//! CHANGELOG.md as tools read it: each release's version and the commit it was cut from. Tags
//! do not travel with every clone, so a tool (an upgrade test from the previous release) finds
//! a release by the commit its `Commit:` line names. The rules are the file's own: every `##`
//! heading is a release, newest first, starting with its version (`X.Y.Z`); its first
//! paragraph is `Commit: <40 hex digits>`, or `Commit: unreleased` for the newest until it is
//! cut.

use pulldown_cmark::{Event, HeadingLevel, Parser, Tag, TagEnd};

/// One release's section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// `0.4.0`: the workspace's version when it was cut.
    pub version: String,
    /// The full commit it was cut from; `None` while it is not cut (`Commit: unreleased`).
    pub commit: Option<String>,
    /// Its `###` headings, e.g. `Upgrade notes`.
    pub headings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("line {line}: a release's heading starts with its version (X.Y.Z): {heading:?}")]
    Heading { line: usize, heading: String },
    #[error("{version}: its first paragraph is not `Commit: <40 hex digits | unreleased>`")]
    Commit { version: String },
    #[error("{version} is listed after {newer}: releases go newest first, each once")]
    Order { version: String, newer: String },
    #[error("{version} is not cut (`Commit: unreleased`) but a newer release is listed above it")]
    Unreleased { version: String },
}

/// The releases, newest first.
pub fn parse(markdown: &str) -> Result<Vec<Release>, Error> {
    let mut releases: Vec<Release> = Vec::new();
    // The open heading's or paragraph's text, and what it is.
    let mut text: Option<String> = None;
    // Whether the newest release still waits for its first paragraph.
    let mut awaiting_commit = false;
    for (event, range) in Parser::new(markdown).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. } | Tag::Paragraph) => text = Some(String::new()),
            Event::Text(part) | Event::Code(part) => {
                if let Some(text) = text.as_mut() {
                    text.push_str(&part);
                }
            }
            Event::SoftBreak | Event::HardBreak => {
                if let Some(text) = text.as_mut() {
                    text.push('\n');
                }
            }
            Event::End(TagEnd::Heading(level)) => {
                let heading = text.take().unwrap_or_default();
                if level == HeadingLevel::H2 {
                    if awaiting_commit {
                        return Err(missing_commit(&releases));
                    }
                    let line = markdown[..range.start].matches('\n').count() + 1;
                    releases.push(release(&heading, line)?);
                    awaiting_commit = true;
                } else if level == HeadingLevel::H3
                    && let Some(release) = releases.last_mut()
                {
                    if awaiting_commit {
                        return Err(missing_commit(&releases));
                    }
                    release.headings.push(heading);
                }
            }
            Event::End(TagEnd::Paragraph) => {
                let paragraph = text.take().unwrap_or_default();
                if awaiting_commit && let Some(release) = releases.last_mut() {
                    let Some(named) = commit(&paragraph) else {
                        return Err(missing_commit(&releases));
                    };
                    release.commit = named;
                    awaiting_commit = false;
                }
            }
            _ => {}
        }
    }
    if awaiting_commit {
        return Err(missing_commit(&releases));
    }
    check_order(&releases)?;
    Ok(releases)
}

/// The release listed right below `version`: the one an upgrade to `version` starts from.
pub fn previous<'r>(releases: &'r [Release], version: &str) -> Option<&'r Release> {
    let at = releases.iter().position(|r| r.version == version)?;
    releases.get(at + 1)
}

fn release(heading: &str, line: usize) -> Result<Release, Error> {
    let version = heading.split_whitespace().next().unwrap_or_default();
    if semver(version).is_none() {
        return Err(Error::Heading {
            line,
            heading: heading.to_owned(),
        });
    }
    Ok(Release {
        version: version.to_owned(),
        commit: None,
        headings: Vec::new(),
    })
}

/// `Commit: <hash>` → `Some(Some(hash))`, `Commit: unreleased` → `Some(None)`, else `None`.
fn commit(paragraph: &str) -> Option<Option<String>> {
    let value = paragraph.lines().next()?.strip_prefix("Commit:")?.trim();
    if value == "unreleased" {
        return Some(None);
    }
    let full = value.len() == 40
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    full.then(|| Some(value.to_owned()))
}

fn missing_commit(releases: &[Release]) -> Error {
    Error::Commit {
        version: releases
            .last()
            .map(|r| r.version.clone())
            .unwrap_or_default(),
    }
}

fn semver(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.split('.').map(|part| part.parse::<u64>().ok());
    let parsed = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(parsed)
}

fn check_order(releases: &[Release]) -> Result<(), Error> {
    for pair in releases.windows(2) {
        let [newer, older] = pair else { continue };
        if semver(&older.version) >= semver(&newer.version) {
            return Err(Error::Order {
                version: older.version.clone(),
                newer: newer.version.clone(),
            });
        }
        if older.commit.is_none() {
            return Err(Error::Unreleased {
                version: older.version.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUT: &str = "12dbe148a80f4dda36721e280f8eb19a36abd8fc";

    fn changelog(releases: &str) -> String {
        format!("# Changelog\n\nWhat changed.\n\n{releases}")
    }

    #[test]
    fn each_release_has_its_version_commit_and_subheadings_newest_first() {
        let text = changelog(&format!(
            "## 0.4.0 (unreleased)\n\nCommit: unreleased\n\n### Upgrade notes\n\n- a step\n\n\
             ## 0.3.0 (cut on a Sunday)\n\nCommit: {CUT}\n\nWhat it held.\n\n### Upgrade notes\n\n\
             ```text\nCommit: 0000000000000000000000000000000000000000\n```\n"
        ));
        let releases = parse(&text).unwrap();
        assert_eq!(
            releases,
            [
                Release {
                    version: "0.4.0".into(),
                    commit: None,
                    headings: vec!["Upgrade notes".into()],
                },
                Release {
                    version: "0.3.0".into(),
                    commit: Some(CUT.into()),
                    headings: vec!["Upgrade notes".into()],
                },
            ]
        );
        assert_eq!(
            previous(&releases, "0.4.0").and_then(|r| r.commit.as_deref()),
            Some(CUT)
        );
        assert_eq!(previous(&releases, "0.3.0"), None);
        assert_eq!(previous(&releases, "0.9.0"), None);
    }

    #[test]
    fn a_heading_without_a_version_is_refused_with_its_line() {
        let text = changelog("## v0.3.0\n\nCommit: unreleased\n");
        assert_eq!(
            parse(&text),
            Err(Error::Heading {
                line: 5,
                heading: "v0.3.0".into()
            })
        );
    }

    #[test]
    fn a_release_without_a_full_commit_is_refused() {
        for first_paragraph in [
            "What it held.".to_owned(),
            "Commit: 12dbe14".to_owned(),
            format!("Commit: {}", CUT.to_uppercase()),
        ] {
            let text = changelog(&format!("## 0.3.0\n\n{first_paragraph}\n"));
            assert_eq!(
                parse(&text),
                Err(Error::Commit {
                    version: "0.3.0".into()
                }),
                "{first_paragraph}"
            );
        }
        let subheading_first = changelog("## 0.3.0\n\n### Upgrade notes\n\nCommit: unreleased\n");
        assert!(matches!(
            parse(&subheading_first),
            Err(Error::Commit { .. })
        ));
        assert!(matches!(
            parse(&changelog("## 0.3.0\n")),
            Err(Error::Commit { .. })
        ));
    }

    #[test]
    fn releases_go_newest_first_and_only_the_newest_may_be_unreleased() {
        let ascending = changelog(&format!(
            "## 0.3.0\n\nCommit: {CUT}\n\n## 0.10.0\n\nCommit: {CUT}\n"
        ));
        assert_eq!(
            parse(&ascending),
            Err(Error::Order {
                version: "0.10.0".into(),
                newer: "0.3.0".into()
            })
        );
        let twice = changelog(&format!(
            "## 0.3.0\n\nCommit: {CUT}\n\n## 0.3.0\n\nCommit: {CUT}\n"
        ));
        assert!(matches!(parse(&twice), Err(Error::Order { .. })));
        let stale = changelog(&format!(
            "## 0.4.0\n\nCommit: {CUT}\n\n## 0.3.0\n\nCommit: unreleased\n"
        ));
        assert_eq!(
            parse(&stale),
            Err(Error::Unreleased {
                version: "0.3.0".into()
            })
        );
    }
}
