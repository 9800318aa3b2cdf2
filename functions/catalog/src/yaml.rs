//! An ordered YAML document, just what the SAM template needs: mappings (in the order they
//! are written, with an optional comment line above an entry), sequences, strings, integers
//! and booleans. Intrinsic functions are written in their long form (`Ref:`, `Fn::Sub:`), so
//! any YAML parser reads the file, not only CloudFormation's.
//!
//! Why not a serde YAML crate: `serde_yaml` is unmaintained, serde_json's maps are sorted
//! (a template ordered `DependsOn, Metadata, Properties, Type` reads badly), and none writes
//! the comments an operator reading `template.yaml` needs. Strings that are not obviously
//! plain are written as JSON strings, which YAML reads as double-quoted scalars.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Map(Vec<Entry>),
    List(Vec<Node>),
    Str(String),
    Int(i64),
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub comment: Option<String>,
    pub key: String,
    pub value: Node,
}

impl From<&str> for Node {
    fn from(s: &str) -> Self {
        Node::Str(s.to_owned())
    }
}

impl From<String> for Node {
    fn from(s: String) -> Self {
        Node::Str(s)
    }
}

impl From<i64> for Node {
    fn from(n: i64) -> Self {
        Node::Int(n)
    }
}

impl From<bool> for Node {
    fn from(b: bool) -> Self {
        Node::Bool(b)
    }
}

impl From<Vec<Node>> for Node {
    fn from(items: Vec<Node>) -> Self {
        Node::List(items)
    }
}

/// `map! { "Key" => value, ... }`: an ordered mapping.
macro_rules! map {
    ($($key:expr => $value:expr),* $(,)?) => {
        $crate::yaml::Node::Map(vec![$($crate::yaml::Entry {
            comment: None,
            key: ($key).to_string(),
            value: $crate::yaml::Node::from($value),
        }),*])
    };
}
pub(crate) use map;

/// `list![a, b]`: a sequence.
macro_rules! list {
    ($($item:expr),* $(,)?) => {
        $crate::yaml::Node::List(vec![$($crate::yaml::Node::from($item)),*])
    };
}
pub(crate) use list;

/// `{Ref: name}`
pub fn reference(name: &str) -> Node {
    map! { "Ref" => name }
}

/// `{Fn::Sub: text}`
pub fn sub(text: &str) -> Node {
    map! { "Fn::Sub" => text }
}

/// `{Fn::GetAtt: [resource, attribute]}`
pub fn get_att(resource: &str, attribute: &str) -> Node {
    map! { "Fn::GetAtt" => list![resource, attribute] }
}

impl Node {
    /// Appends `key: value` to a mapping (no-op on anything else).
    pub fn insert(&mut self, key: &str, value: impl Into<Node>) {
        self.insert_commented(None, key, value);
    }

    /// Appends `key: value` with a comment line above it.
    pub fn insert_commented(&mut self, comment: Option<&str>, key: &str, value: impl Into<Node>) {
        if let Node::Map(entries) = self {
            entries.push(Entry {
                comment: comment.map(str::to_owned),
                key: key.to_owned(),
                value: value.into(),
            });
        }
    }

    /// The mapping without its entries whose value is an empty sequence: CloudFormation reads
    /// an absent list as an empty one, and the template reads better without `[]`.
    pub fn without_empty_lists(mut self) -> Node {
        if let Node::Map(entries) = &mut self {
            entries.retain(|e| !matches!(&e.value, Node::List(items) if items.is_empty()));
        }
        self
    }

    /// The value under `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|e| e.key == key).map(|e| &e.value),
            _ => None,
        }
    }

    /// The value under `key` of a mapping, to change it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        match self {
            Node::Map(entries) => entries
                .iter_mut()
                .find(|e| e.key == key)
                .map(|e| &mut e.value),
            _ => None,
        }
    }

    /// The same document as JSON (maps sorted), for tests and tools.
    pub fn to_json(&self) -> Value {
        match self {
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.to_json()))
                    .collect(),
            ),
            Node::List(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Node::Str(s) => Value::String(s.clone()),
            Node::Int(n) => Value::from(*n),
            Node::Bool(b) => Value::Bool(*b),
        }
    }

    /// The document as YAML text.
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        match self {
            Node::Map(entries) if !entries.is_empty() => write_entries(&mut out, entries, 0),
            Node::List(items) if !items.is_empty() => write_items(&mut out, items, 0),
            scalar => {
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
        out
    }
}

fn write_entries(out: &mut String, entries: &[Entry], indent: usize) {
    let pad = " ".repeat(indent);
    for entry in entries {
        if let Some(comment) = &entry.comment {
            for line in comment.lines() {
                out.push_str(&format!("{pad}# {line}\n").replace("# \n", "#\n"));
            }
        }
        out.push_str(&format!("{pad}{}:", scalar_text(&entry.key)));
        write_value(out, &entry.value, indent);
    }
}

fn write_items(out: &mut String, items: &[Node], indent: usize) {
    let pad = " ".repeat(indent);
    for item in items {
        out.push_str(&pad);
        out.push('-');
        match item {
            Node::Map(entries) if !entries.is_empty() => {
                // The block as if indented under the dash, its first line's indent replaced
                // by the dash: `- Key: value`, the other keys aligned under `Key`.
                let mut block = String::new();
                write_entries(&mut block, entries, indent + 2);
                out.push(' ');
                out.push_str(block.get(indent + 2..).unwrap_or_default());
            }
            Node::List(inner) if !inner.is_empty() => {
                out.push('\n');
                write_items(out, inner, indent + 2);
            }
            scalar => {
                out.push(' ');
                out.push_str(&inline(scalar));
                out.push('\n');
            }
        }
    }
}

fn write_value(out: &mut String, value: &Node, indent: usize) {
    match value {
        Node::Map(entries) if !entries.is_empty() => {
            out.push('\n');
            write_entries(out, entries, indent + 2);
        }
        Node::List(items) if !items.is_empty() => {
            out.push('\n');
            write_items(out, items, indent + 2);
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

/// A scalar (or an empty collection) on one line.
fn inline(node: &Node) -> String {
    match node {
        Node::Str(s) => scalar_text(s),
        Node::Int(n) => n.to_string(),
        Node::Bool(b) => b.to_string(),
        Node::Map(_) => "{}".to_owned(),
        Node::List(_) => "[]".to_owned(),
    }
}

/// Plain when nothing in it means something to YAML, else a JSON (double-quoted) string.
fn scalar_text(s: &str) -> String {
    if is_plain(s) {
        s.to_owned()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

fn is_plain(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~",
    ];
    let Some(first) = s.chars().next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '/')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-' | ':'))
        && !s.ends_with(':')
        && !WORDS.contains(&s.to_ascii_lowercase().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_maps_lists_and_scalars_are_written_as_block_yaml() {
        let mut doc = map! {
            "Type" => "AWS::Serverless::Function",
            "Queues" => list!["paybus.canary"],
            "Size" => 100i64,
            "Empty" => Node::List(vec![]),
        };
        doc.insert_commented(
            Some("why it is there"),
            "Access",
            list![map! { "Type" => "BASIC_AUTH", "URI" => reference("Secret") }],
        );
        doc.insert("Schedule", "rate(1 minute)");
        doc.insert("Word", "yes");
        assert_eq!(
            doc.to_yaml(),
            "Type: AWS::Serverless::Function\n\
             Queues:\n  - paybus.canary\n\
             Size: 100\n\
             Empty: []\n\
             # why it is there\n\
             Access:\n  - Type: BASIC_AUTH\n    URI:\n      Ref: Secret\n\
             Schedule: \"rate(1 minute)\"\n\
             Word: \"yes\"\n"
        );
    }

    #[test]
    fn a_list_in_a_map_in_a_list_stays_under_its_key() {
        let doc = map! { "Fn::Not" => list![map! { "Fn::Equals" => list![reference("A"), ""] }] };
        assert_eq!(
            doc.to_yaml(),
            "Fn::Not:\n  - Fn::Equals:\n      - Ref: A\n      - \"\"\n"
        );
    }

    #[test]
    fn strings_with_yaml_meaning_are_quoted() {
        for s in [
            "",
            "-x",
            "a: b",
            "#x",
            "${AWS::StackName}",
            "true",
            "1",
            "a b",
            "x:",
        ] {
            assert!(!is_plain(s), "{s:?} must be quoted");
        }
        for s in [
            "paybus.canary.dlq",
            "AWS::Lambda::Function",
            "/paybus/x",
            "provided.al2023",
        ] {
            assert!(is_plain(s), "{s:?} can be plain");
        }
    }
}
