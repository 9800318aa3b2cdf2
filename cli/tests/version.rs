//! `paybus --version`: the release and the commit the binary was built from.

use std::process::Command;

#[test]
fn version_names_the_release_and_the_commit_it_was_built_from() {
    let output = Command::new(env!("CARGO_BIN_EXE_paybus"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap().trim_end(),
        format!(
            "paybus {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            paybus_testkit::head_commit()
        )
    );
}
