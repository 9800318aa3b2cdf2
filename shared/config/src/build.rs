//! What this binary is: the release (the workspace's version, CHANGELOG.md) and the commit it
//! was built from, which `paybus --version`, `/health`, `paybus_build_info` and the traces'
//! resource report, so a fault can be laid beside the deploy that brought it.

/// The release, e.g. `0.4.0`: `[workspace.package] version` in Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The full commit hash the build came from (build.rs: `git rev-parse HEAD`), or `unknown` when
/// it was built outside a git checkout.
pub const COMMIT: &str = env!("BUILD_GIT_COMMIT");

/// `0.4.0 (commit 1a2b…)`: what `paybus --version` prints after the command's name.
pub const VERSION_AND_COMMIT: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_GIT_COMMIT"),
    ")"
);
