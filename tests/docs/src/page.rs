//! A markdown page as GitHub renders it: its headings, the anchors GitHub gives them, and the
//! links it holds.

use std::collections::BTreeSet;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// A link's target as written, with the line it is on (for the failure message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub target: String,
    pub line: usize,
}

/// What the checks need of one page.
#[derive(Debug, Default)]
pub struct Page {
    /// Each heading's text (inline code included, markup left out), in order.
    pub headings: Vec<String>,
    pub links: Vec<Link>,
}

impl Page {
    pub fn parse(markdown: &str) -> Self {
        let mut page = Page::default();
        let mut heading: Option<String> = None;
        let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
        for (event, range) in Parser::new_ext(markdown, options).into_offset_iter() {
            match event {
                Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
                Event::End(TagEnd::Heading(_)) => page.headings.extend(heading.take()),
                Event::Text(text) | Event::Code(text) => {
                    if let Some(heading) = heading.as_mut() {
                        heading.push_str(&text);
                    }
                }
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                    let line = markdown[..range.start].matches('\n').count() + 1;
                    page.links.push(Link {
                        target: dest_url.into_string(),
                        line,
                    });
                }
                _ => {}
            }
        }
        page
    }

    /// The anchors GitHub makes of the headings: each heading's slug, a repeated one with
    /// `-1`, `-2`, … appended.
    pub fn anchors(&self) -> BTreeSet<String> {
        let mut anchors = BTreeSet::new();
        for heading in &self.headings {
            let slug = slug(heading);
            let mut anchor = slug.clone();
            let mut repeat = 0;
            while !anchors.insert(anchor.clone()) {
                repeat += 1;
                anchor = format!("{slug}-{repeat}");
            }
        }
        anchors
    }
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces made
/// `-`, everything else dropped.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_githubs() {
        assert_eq!(
            slug("Principle 4: success is judged from the result, not from an exception"),
            "principle-4-success-is-judged-from-the-result-not-from-an-exception"
        );
        assert_eq!(
            slug("Seed 000 §3.3: judge success"),
            "seed-000-33-judge-success"
        );
        assert_eq!(slug("2026-12-01 — p2p (W1)"), "2026-12-01--p2p-w1");
        assert_eq!(
            slug("Seed 004 §5: order (순서와 중복)"),
            "seed-004-5-order-순서와-중복"
        );
        assert_eq!(
            slug("`paybus_p2p::quote` outcomes"),
            "paybus_p2pquote-outcomes"
        );
    }

    #[test]
    fn a_page_has_its_headings_anchors_and_links() {
        let page = Page::parse(
            "# Title\n\nSee [there](other.md#a-b) and ![pic](p.png).\n\n## A `b`\n\n## A `b`\n",
        );
        assert_eq!(page.headings, ["Title", "A b", "A b"]);
        let anchors: Vec<String> = page.anchors().into_iter().collect();
        assert_eq!(anchors, ["a-b", "a-b-1", "title"]);
        let targets: Vec<(&str, usize)> = page
            .links
            .iter()
            .map(|l| (l.target.as_str(), l.line))
            .collect();
        assert_eq!(targets, [("other.md#a-b", 3), ("p.png", 3)]);
    }
}
