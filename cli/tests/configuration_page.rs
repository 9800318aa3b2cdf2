//! The configuration page is the code's: `docs/configuration.md` equals what `paybus settings`
//! prints from the settings' declarations, and every `PAYBUS_*` variable the code or the local
//! services' scripts name is declared there, so none can be read without its row.

use paybus_testkit::repository;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

/// What `paybus settings` prints, in an empty environment (the page must not depend on it).
fn generated_page() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_paybus"))
        .arg("settings")
        .env_clear()
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// Each declared variable with its documented default, from the page's table rows.
fn declared(page: &str) -> BTreeMap<String, String> {
    page.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|row| {
            let (name, rest) = row.split_once("` | ")?;
            let default = rest.split(" | ").next()?;
            Some((name.to_owned(), default.to_owned()))
        })
        .collect()
}

fn files(dir: &Path, extension: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            // Not ours (vendor), or not source (build output, local state, git).
            if !matches!(name.as_ref(), "vendor" | "target" | ".local" | ".git") {
                files(&path, extension, out);
            }
        } else if path.extension().is_some_and(|e| e == extension) {
            out.push(path);
        }
    }
}

#[test]
fn the_shipped_configuration_page_is_what_the_code_declares() {
    let shipped =
        std::fs::read_to_string(repository().join("docs/configuration.md")).unwrap_or_default();
    let generated = generated_page();
    assert!(
        shipped == generated,
        "docs/configuration.md differs from the settings' declarations; regenerate it with:\n\
         cargo run -q -p paybus -- settings > docs/configuration.md"
    );
}

#[test]
fn every_paybus_variable_the_rust_code_names_is_declared() {
    let declared = declared(&generated_page());
    let mut sources = Vec::new();
    files(repository(), "rs", &mut sources);
    let mut undeclared = BTreeSet::new();
    for file in &sources {
        // A `tests.rs` is a unit-test module held in a file of its own (`#[cfg(test)] mod
        // tests;`): its variables are made up by the test, as those after `#[cfg(test)]` are.
        if file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        // Unit tests sit at the end of a file; their made-up variables do not count.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for literal in code.split("\"PAYBUS_").skip(1) {
            let rest: String = literal
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if rest.is_empty() {
                continue;
            }
            let name = format!("PAYBUS_{rest}");
            // `PAYBUS_X_FROM` is `PAYBUS_X`'s reference form, one row for all of them.
            let variable = name.strip_suffix("_FROM").unwrap_or(&name);
            if !declared.contains_key(variable) {
                let file = file.strip_prefix(repository()).unwrap_or(file);
                undeclared.insert(format!("{name} in {}", file.display()));
            }
        }
    }
    assert!(
        undeclared.is_empty(),
        "variables named in the code but declared nowhere (declare each as a `Setting` beside \
         its reader and add it to its crate's SETTINGS, then regenerate docs/configuration.md):\n{}",
        undeclared.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_setting_of_the_infra_scripts_is_declared_with_its_default() {
    let declared = declared(&generated_page());
    let mut scripts = Vec::new();
    files(&repository().join("infra"), "sh", &mut scripts);
    let mut wrong = Vec::new();
    for script in &scripts {
        let text = std::fs::read_to_string(script).unwrap();
        // A script's setting is `: "${PAYBUS_X:=default}"`: a value the caller may override.
        for line in text.lines().map(str::trim) {
            let Some(assignment) = line.strip_prefix(": \"${") else {
                continue;
            };
            let Some((name, rest)) = assignment.split_once(":=") else {
                continue;
            };
            let default = rest.strip_suffix("}\"").unwrap_or(rest);
            let script = script.strip_prefix(repository()).unwrap_or(script);
            match declared.get(name) {
                None => wrong.push(format!("{name} ({}) is not declared", script.display())),
                Some(documented)
                    if !default.contains('$') && *documented != format!("`{default}`") =>
                {
                    wrong.push(format!(
                        "{name} ({}) defaults to {default}, documented as {documented}",
                        script.display()
                    ));
                }
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
