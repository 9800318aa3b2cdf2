//! A setting's one declaration: the variable its reader passes to `config::Vars`, its
//! default as the documentation shows it, and what it does.
//!
//! The configuration page (`docs/configuration.md`, printed by `paybus settings`) is made of
//! these declarations, and every reader takes one instead of a bare name: a renamed variable
//! renames its row, and a variable nobody declared cannot be read through `Vars`.

use std::collections::HashMap;

/// One environment variable paybus reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Setting {
    /// The variable, e.g. `PAYBUS_PREFETCH`.
    pub name: &'static str,
    /// What applies while it is unset or empty, as the page shows it (markdown): one literal in
    /// backticks, which each crate's tests read back through its reader (see
    /// [`documented_defaults`]), or words when there is no value (`unset`).
    pub default: &'static str,
    /// What it does, one line of markdown.
    pub about: &'static str,
}

impl Setting {
    /// The documented default as the reader would parse it (`32` of "`32`"), when it is one
    /// literal.
    pub fn default_value(&self) -> Option<&'static str> {
        let inner = self.default.strip_prefix('`')?.strip_suffix('`')?;
        (!inner.contains('`')).then_some(inner)
    }
}

/// The settings one part of paybus reads: a section of the configuration page.
#[derive(Debug, Clone, Copy)]
pub struct SettingGroup {
    pub title: &'static str,
    /// Who reads them, one line of markdown under the title.
    pub read_by: &'static str,
    pub settings: &'static [Setting],
}

/// For each setting of `settings` whose default is a literal: its name and an environment with
/// only that literal set. A reader given it must return what it returns for an empty one, or
/// the page documents a default the code does not have.
pub fn documented_defaults(
    settings: &'static [Setting],
) -> impl Iterator<Item = (&'static str, HashMap<String, String>)> {
    settings.iter().filter_map(|setting| {
        let value = setting.default_value()?;
        let environment = HashMap::from([(setting.name.to_owned(), value.to_owned())]);
        Some((setting.name, environment))
    })
}

/// The groups as markdown: a `##` section each, with a `variable | default | meaning` table.
pub fn markdown(groups: &[SettingGroup]) -> String {
    let mut out = String::new();
    for group in groups {
        out.push_str(&format!("\n## {}\n\n{}\n\n", group.title, group.read_by));
        out.push_str("| variable | default | meaning |\n| --- | --- | --- |\n");
        for setting in group.settings {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                setting.name, setting.default, setting.about
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PORT: Setting = Setting {
        name: "PAYBUS_SOME_PORT",
        default: "`5682`",
        about: "where it listens",
    };

    #[test]
    fn a_default_in_backticks_is_a_value_and_words_are_not() {
        assert_eq!(PORT.default_value(), Some("5682"));
        let unset = Setting {
            default: "unset",
            ..PORT
        };
        assert_eq!(unset.default_value(), None);
        let two = Setting {
            default: "`a` or `b`",
            ..PORT
        };
        assert_eq!(two.default_value(), None);
    }

    #[test]
    fn a_group_is_a_section_with_one_row_per_setting() {
        let page = markdown(&[SettingGroup {
            title: "Things",
            read_by: "Read by the thing.",
            settings: &[PORT],
        }]);
        assert_eq!(
            page,
            "\n## Things\n\nRead by the thing.\n\n| variable | default | meaning |\n\
             | --- | --- | --- |\n| `PAYBUS_SOME_PORT` | `5682` | where it listens |\n"
        );
    }
}
