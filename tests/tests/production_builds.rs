//! What is deployed links no test code. For `paybus` and every Lambda of the template (the
//! catalog's `sam::deployables`), the crates its package's own build compiles, read from
//! `cargo tree -e normal,features`, hold neither the test kit nor a test feature of ours; and a
//! whole-workspace build, which also builds the test kit's two normal dependents (the lab and
//! the chaos harness's broken binaries), turns on no test feature of a production crate, so
//! its production binaries are the ones deployed.

use std::process::Command;

use paybus_testkit::repository;

const TEST_KIT: &str = "paybus-testkit";

/// A feature of one of our crates that exists for tests, by its name (`test-harness`).
fn is_test_feature(krate: &str, feature: &str) -> bool {
    krate.starts_with("paybus") && (feature.contains("test") || feature.contains("harness"))
}

/// `cargo tree -e normal,features` of `selection` (`-p <package>`, `--workspace`), a line per
/// crate or feature, without the tree's indentation.
fn normal_tree(selection: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .current_dir(repository())
        .args([
            "tree",
            "--offline",
            "-e",
            "normal,features",
            "--prefix",
            "none",
        ])
        .args(selection)
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree {selection:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What in `tree` is test code: the test kit itself, and every test feature of ours.
fn test_code(tree: &[String]) -> Vec<String> {
    let mut found: Vec<String> = tree
        .iter()
        .filter_map(|line| {
            let (krate, rest) = line.split_once(' ')?;
            if krate == TEST_KIT {
                return Some(format!("{krate} is linked"));
            }
            let feature = rest.strip_prefix("feature \"")?.split('"').next()?;
            is_test_feature(krate, feature).then(|| format!("{krate} feature \"{feature}\""))
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The package of the deployed binary built from the crate in `crate_dir`.
fn package_in(crate_dir: &str) -> String {
    let manifest = std::fs::read_to_string(repository().join(crate_dir).join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("{crate_dir}/Cargo.toml: {e}"));
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("name = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{crate_dir}/Cargo.toml names its package first"))
        .to_owned()
}

#[test]
fn no_deployed_binary_links_the_test_kit_or_a_test_feature() {
    let mut packages = vec![package_in("cli")];
    packages.extend(
        paybus_catalog::sam::deployables()
            .iter()
            .map(|lambda| package_in(&lambda.crate_dir)),
    );
    packages.dedup();
    assert!(
        packages.len() >= 12,
        "paybus, the functions, the API, the sweeper, the recorder and migrate: {packages:?}"
    );

    let found: Vec<(String, Vec<String>)> = packages
        .iter()
        .map(|package| (package.clone(), test_code(&normal_tree(&["-p", package]))))
        .filter(|(_, found)| !found.is_empty())
        .collect();

    assert!(found.is_empty(), "test code in deployed builds: {found:#?}");
}

#[test]
fn a_whole_workspace_build_turns_on_no_test_feature_of_a_production_crate() {
    let tree = normal_tree(&["--workspace"]);
    assert!(
        tree.iter().any(|line| line.starts_with(TEST_KIT)),
        "the lab links the test kit, so the workspace's tree holds it"
    );

    let features: Vec<String> = test_code(&tree)
        .into_iter()
        .filter(|found| !found.starts_with(TEST_KIT))
        .collect();

    assert!(features.is_empty(), "test features: {features:#?}");
}
