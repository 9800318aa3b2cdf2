//! Every secret a Lambda's code reads reaches it from the template as a `_FROM` reference
//! with the right to fetch it, never as a plain value, and no Lambda is handed a secret it
//! does not read. What the code reads is derived from the code, so the next workflow cannot
//! forget its secret: every `Vars::secret(VARIABLE, ..)` call in a workspace crate's sources,
//! and the crates each Lambda's binary is built from (its crate's `paybus-*` dependencies,
//! transitively).
#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed

use paybus_testkit::repository;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use paybus_catalog::sam::{self, pascal_case};
use serde_json::Value;

/// The catalog is a list: only the sweeper builds what is in it (every function's jobs); the
/// API, the recorder and `migrate` take names and triage from it.
const CATALOG: &str = "paybus-catalog";
const SWEEPER: &str = "sweeper";

/// The platform's connection settings: read by `Settings` (as URLs, not through
/// `Vars::secret`) in every process; the template passes them as references too.
const CONNECTION_SECRETS: &[&str] = &["PAYBUS_DATABASE_URL", "PAYBUS_AMQP_URL"];

struct Crate {
    dir: PathBuf,
    dependencies: Vec<String>,
    /// Variables its sources read with `Vars::secret` (test modules left out).
    secrets: BTreeSet<String>,
}

/// The workspace's crates by package name.
fn workspace() -> BTreeMap<String, Crate> {
    let mut dirs = vec![repository().join("api")];
    for group in ["shared", "functions"] {
        for entry in std::fs::read_dir(repository().join(group)).unwrap() {
            dirs.push(entry.unwrap().path());
        }
    }
    let mut crates = BTreeMap::new();
    let mut sources = Vec::new();
    for dir in dirs {
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = manifest
            .lines()
            .find_map(|line| line.strip_prefix("name = \""))
            .and_then(|rest| rest.split('"').next())
            .unwrap()
            .to_owned();
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        let texts: Vec<String> = files
            .iter()
            .map(|file| {
                let text = std::fs::read_to_string(file).unwrap();
                // Test modules sit at the end of a file; their made-up variables do not count.
                match text.find("#[cfg(test)]") {
                    Some(at) => text[..at].to_owned(),
                    None => text,
                }
            })
            .collect();
        sources.push((name.clone(), texts));
        crates.insert(
            name,
            Crate {
                dir,
                dependencies: dependencies(&manifest),
                secrets: BTreeSet::new(),
            },
        );
    }
    let constants = constants(&sources);
    for (name, texts) in &sources {
        let secrets = texts
            .iter()
            .flat_map(|text| secret_reads(text, name, &constants))
            .collect();
        crates.get_mut(name).unwrap().secrets = secrets;
    }
    crates
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `paybus-*` crates of a manifest's `[dependencies]` (not its dev-dependencies).
fn dependencies(manifest: &str) -> Vec<String> {
    manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .flat_map(|section| section.lines().skip(1))
        .filter(|line| line.starts_with("paybus-"))
        .map(|line| {
            line.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
        .collect()
}

/// `const NAME: &str = "VALUE";` and `const NAME: Setting = Setting { name: "VALUE", .. }` of
/// every crate, by crate and name.
fn constants(sources: &[(String, Vec<String>)]) -> BTreeMap<(String, String), String> {
    let mut constants = BTreeMap::new();
    for (crate_name, texts) in sources {
        for text in texts {
            for part in text.split("const ").skip(1) {
                let line = part.lines().next().unwrap_or_default();
                let value = if let Some((name, rest)) = line.split_once(": &str = \"") {
                    rest.split('"').next().map(|value| (name, value))
                } else if let Some((name, _)) = line.split_once(": Setting = Setting {") {
                    part.split_once("name: \"")
                        .and_then(|(_, rest)| rest.split('"').next())
                        .map(|value| (name, value))
                } else {
                    None
                };
                if let Some((name, value)) = value {
                    constants.insert(
                        (crate_name.clone(), name.trim().to_owned()),
                        value.to_owned(),
                    );
                }
            }
        }
    }
    constants
}

/// The variable of every `.secret(` call in `text`: a string literal, or a constant of the
/// crate (or, when the crate has none of that name, of the one crate that has it).
fn secret_reads(
    text: &str,
    crate_name: &str,
    constants: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    text.split(".secret(")
        .skip(1)
        .map(|call| {
            let argument = call.trim_start();
            if let Some(literal) = argument.strip_prefix('"') {
                return literal.split('"').next().unwrap().to_owned();
            }
            let path: String = argument
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let name = path.rsplit("::").next().unwrap();
            let own = constants.get(&(crate_name.to_owned(), name.to_owned()));
            let anywhere: Vec<&String> = constants
                .iter()
                .filter(|((_, n), _)| n == name)
                .map(|(_, value)| value)
                .collect();
            match (own, anywhere.as_slice()) {
                (Some(value), _) | (None, &[value]) => value.clone(),
                _ => panic!(
                    "{crate_name}: cannot tell which variable `.secret({path}` reads; \
                     name it with a `const {name}: &str = \"PAYBUS_...\"`"
                ),
            }
        })
        .collect()
}

/// The secrets the binary of `lambda` reads: those of its crate and of every crate it is
/// built from.
fn reads(workspace: &BTreeMap<String, Crate>, lambda: &sam::Deployable) -> BTreeSet<String> {
    let dir = repository().join(&lambda.crate_dir);
    let (root, _) = workspace
        .iter()
        .find(|(_, c)| c.dir == dir)
        .unwrap_or_else(|| panic!("no crate in {}", lambda.crate_dir));
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.clone()];
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let Some(c) = workspace.get(&name) else {
            continue;
        };
        for dependency in &c.dependencies {
            if dependency != CATALOG || lambda.binary == SWEEPER {
                todo.push(dependency.clone());
            }
        }
    }
    seen.iter()
        .filter_map(|name| workspace.get(name))
        .flat_map(|c| c.secrets.iter().cloned())
        .collect()
}

/// The parameters a function's policies name (the references they let it read; which ARN
/// and action each form of reference gets is `translated.rs`'s to check).
fn readable_parameters(resource: &Value) -> BTreeSet<String> {
    fn refs(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(name)) = map.get("Ref") {
                    out.insert(name.clone());
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut parameters = BTreeSet::new();
    refs(&resource["Properties"]["Policies"], &mut parameters);
    parameters
}

/// What the template gets wrong about the secrets the code reads.
fn problems(template: &Value, workspace: &BTreeMap<String, Crate>) -> Vec<String> {
    let every_secret: BTreeSet<String> = workspace
        .values()
        .flat_map(|c| c.secrets.iter().cloned())
        .chain(CONNECTION_SECRETS.iter().map(|s| (*s).to_owned()))
        .collect();
    let mut problems = Vec::new();
    for lambda in sam::deployables() {
        let id = format!("{}Function", pascal_case(lambda.binary));
        let resource = &template["Resources"][&id];
        let mut environment = template["Globals"]["Function"]["Environment"]["Variables"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        if let Some(own) = resource["Properties"]["Environment"]["Variables"].as_object() {
            environment.extend(own.clone());
        }
        let readable = readable_parameters(resource);
        let read = reads(workspace, &lambda);
        for variable in &read {
            let reference = format!("{variable}_FROM");
            match environment.get(&reference).and_then(|r| r["Ref"].as_str()) {
                None => problems.push(format!(
                    "{}: reads {variable} but has no {reference}",
                    lambda.binary
                )),
                Some(parameter) if !readable.contains(parameter) => problems.push(format!(
                    "{}: {reference} names {parameter}, which its policies do not let it read",
                    lambda.binary
                )),
                Some(_) => {}
            }
        }
        for (name, _) in &environment {
            if every_secret.contains(name) {
                problems.push(format!("{}: {name} is a plain value", lambda.binary));
            }
            if let Some(variable) = name.strip_suffix("_FROM") {
                let needed = read.contains(variable) || CONNECTION_SECRETS.contains(&variable);
                if !needed {
                    problems.push(format!(
                        "{}: gets {name} but never reads {variable}",
                        lambda.binary
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn the_code_reads_the_secrets_of_every_workflow() {
    // The derivation finds what the workflows read: a scan that found nothing would make the
    // check below pass for nothing.
    let workspace = workspace();
    let api = sam::deployables()
        .into_iter()
        .find(|l| l.binary == "api")
        .unwrap();
    let matcher = sam::deployables()
        .into_iter()
        .find(|l| l.binary == "match-deposit")
        .unwrap();

    let api_reads = reads(&workspace, &api);
    let matcher_reads = reads(&workspace, &matcher);

    for secret in [
        "PAYBUS_ADMIN_JWT_SECRET",
        "PAYBUS_CHAIN_MONITOR_SECRET",
        "PAYBUS_PAYMENTS_SECRET",
        "PAYBUS_QUOTE_API_KEY",
    ] {
        assert!(api_reads.contains(secret), "api: {api_reads:?}");
    }
    assert_eq!(
        matcher_reads,
        BTreeSet::from(["PAYBUS_QUOTE_API_KEY".to_owned()])
    );
}

#[test]
fn every_secret_a_lambda_reads_is_a_reference_it_may_fetch() {
    let template = sam::template().to_json();

    assert_eq!(problems(&template, &workspace()), Vec::<String>::new());
}

#[test]
fn a_forgotten_or_plain_secret_is_caught() {
    // The control: the API lost its payments secret, match-deposit got its key in plain
    // text, and the recorder got a reference it never reads.
    let workspace = workspace();
    let mut template = sam::template().to_json();
    template["Resources"]["ApiFunction"]["Properties"]["Environment"]["Variables"]
        .as_object_mut()
        .unwrap()
        .remove("PAYBUS_PAYMENTS_SECRET_FROM");
    let matcher = &mut template["Resources"]["MatchDepositFunction"]["Properties"];
    let variables = matcher["Environment"]["Variables"].as_object_mut().unwrap();
    variables.remove("PAYBUS_QUOTE_API_KEY_FROM");
    variables.insert("PAYBUS_QUOTE_API_KEY".into(), "a-key-in-plain-text".into());
    template["Resources"]["DeadLettersFunction"]["Properties"]["Environment"] = serde_json::json!({"Variables": {"PAYBUS_ADMIN_JWT_SECRET_FROM": {"Ref": "AdminJwtSecretArn"}}});

    let found = problems(&template, &workspace);

    for expected in [
        "api: reads PAYBUS_PAYMENTS_SECRET but has no PAYBUS_PAYMENTS_SECRET_FROM",
        "match-deposit: reads PAYBUS_QUOTE_API_KEY but has no PAYBUS_QUOTE_API_KEY_FROM",
        "match-deposit: PAYBUS_QUOTE_API_KEY is a plain value",
        "dead-letters: gets PAYBUS_ADMIN_JWT_SECRET_FROM but never reads PAYBUS_ADMIN_JWT_SECRET",
    ] {
        assert!(found.iter().any(|p| p == expected), "{expected}: {found:?}");
    }
}
