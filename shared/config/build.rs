//! The commit this build comes from, for `paybus_config::build::COMMIT`: `git rev-parse HEAD`
//! in the crate's checkout, or `unknown` where there is none (a source archive, no `git`).
//! Cargo runs this again when HEAD moves: a checkout, or a commit on the branch checked out.

use std::{path::PathBuf, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&["rev-parse", "HEAD"])
        .filter(|hash| hash.len() == 40 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BUILD_GIT_COMMIT={commit}");
    for file in head_files() {
        println!("cargo:rerun-if-changed={}", file.display());
    }
}

/// The files that change when HEAD moves, as `git rev-parse --git-path` places them, so a
/// linked worktree's own HEAD and the branch refs it shares with the main one are both found.
/// Only those that exist: Cargo runs a build script every time for a missing one.
fn head_files() -> Vec<PathBuf> {
    let mut paths = vec![
        "HEAD".to_owned(),
        "logs/HEAD".to_owned(),
        "packed-refs".to_owned(),
    ];
    // The branch HEAD names (none when detached): a commit rewrites its file. A packed one has
    // no file until the next commit writes it; that commit appends to logs/HEAD.
    paths.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return Vec::new();
    };
    paths
        .iter()
        .filter_map(|path| git(&["rev-parse", "--git-path", path]))
        // Relative to the crate's folder in the main checkout, absolute in a linked worktree.
        .map(|path| dir.join(path))
        .filter(|path| path.is_file())
        .collect()
}

/// `git ARGS`' first line of output, run in this crate's folder; `None` when it fails.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let output = Command::new("git")
        .args(args)
        .current_dir(&dir)
        .output()
        .ok()
        .filter(|output| output.status.success())?;
    let text = String::from_utf8(output.stdout).ok()?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_owned())
}
