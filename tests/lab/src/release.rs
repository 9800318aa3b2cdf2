//! An earlier release's binaries, for the upgrade run: found by the commit CHANGELOG.md names
//! (tags may not travel with a clone), checked out in a worktree of its own under
//! `.local/releases/` and built there once, with a target directory of its own (sharing this
//! build's compiled dependencies). Its sources are never this checkout's: a release is what
//! was cut, not what the code says today.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

/// This build's release (the workspace's version).
pub(crate) const THIS_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A release as the changelog names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Release {
    pub(crate) version: String,
    pub(crate) commit: String,
}

impl Release {
    /// `asked`: a version CHANGELOG.md lists, or a commit (at least 7 hex digits); none: the
    /// release listed below this build's.
    pub(crate) fn find(repository: &Path, asked: Option<&str>) -> anyhow::Result<Self> {
        let path = repository.join("CHANGELOG.md");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let releases = paybus_docs::changelog::parse(&text)
            .with_context(|| format!("reading the releases of {}", path.display()))?;
        let release =
            match asked {
                None => paybus_docs::changelog::previous(&releases, THIS_VERSION).with_context(
                    || format!("{} lists no release below {THIS_VERSION}", path.display()),
                )?,
                Some(asked) => match releases.iter().find(|r| r.version == asked) {
                    Some(release) => release,
                    None if is_commit(asked) => {
                        return Ok(Self {
                            version: format!("commit {}", &asked[..asked.len().min(12)]),
                            commit: rev_parse(repository, asked)?,
                        });
                    }
                    None => bail!(
                        "--from {asked}: neither a release of {} ({}) nor a commit",
                        path.display(),
                        releases
                            .iter()
                            .map(|r| r.version.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
            };
        let Some(commit) = release.commit.clone() else {
            bail!(
                "{} is not cut yet (`Commit: unreleased`): there is nothing to build",
                release.version
            );
        };
        Ok(Self {
            version: release.version.clone(),
            commit,
        })
    }

    /// The folder of its worktree, target directory and the built mark.
    fn home(&self, repository: &Path) -> PathBuf {
        repository
            .join(".local/releases")
            .join(&self.commit[..12.min(self.commit.len())])
    }

    /// The folder of its binaries, built first if they are not (minutes: a whole debug build
    /// of `packages` from nothing, printed as it goes on standard error).
    pub(crate) fn binaries(
        &self,
        repository: &Path,
        packages: &[String],
    ) -> anyhow::Result<PathBuf> {
        let home = self.home(repository);
        let bin_dir = home.join("target/debug");
        let mark = home.join("built");
        let wanted = format!("{}\n{}\n", self.commit, packages.join(" "));
        // The mark says what was built; the binary says it is still there (a target folder
        // wiped by hand keeps the mark).
        if std::fs::read_to_string(&mark).is_ok_and(|built| built == wanted)
            && bin_dir.join("paybus").is_file()
        {
            return Ok(bin_dir);
        }
        let sources = home.join("src");
        self.check_out(repository, &sources)?;
        eprintln!(
            "release {} ({}): building its binaries in {}",
            self.version,
            &self.commit[..12.min(self.commit.len())],
            home.display()
        );
        // The `cargo` on PATH (rustup's proxy, where rustup is installed), not `$CARGO`: run in
        // the release's tree, the proxy picks the release's own toolchain file and hands it to
        // every `rustc` below it. A toolchain's cargo run directly leaves each `rustc` proxy to
        // read the toolchain file of the directory it runs in, and crates such as flagset ship
        // one naming a toolchain nobody installed.
        let mut cargo = Command::new("cargo");
        cargo
            .current_dir(&sources)
            .args(["build", "--locked", "--bins"])
            .args(packages.iter().flat_map(|p| ["-p", p.as_str()]))
            .env("CARGO_TARGET_DIR", home.join("target"))
            // A build made once gains nothing from incremental caches, which take gigabytes.
            .env("CARGO_INCREMENTAL", "0")
            // The release's toolchain file decides, not the one that built this lab.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC")
            .env_remove("CARGO_MANIFEST_DIR");
        // The dependencies both releases lock at the same versions (most of them) are compiled
        // once: the release's intermediate files go to the build folder this lab was built in,
        // where they already are. Its own crates differ by path, so they overwrite nothing
        // there, and its binaries still go to its own target folder.
        if let Some(build_dir) = this_build_dir() {
            cargo.env("CARGO_BUILD_BUILD_DIR", build_dir);
        }
        let status = cargo.status().context("running cargo")?;
        if !status.success() {
            bail!(
                "building release {} in {} failed ({status})",
                self.version,
                sources.display()
            );
        }
        std::fs::write(&mark, wanted)?;
        Ok(bin_dir)
    }

    /// Its worktree at `sources`, at its commit (fetched if a shallow clone lacks it).
    fn check_out(&self, repository: &Path, sources: &Path) -> anyhow::Result<()> {
        if git(
            repository,
            &["cat-file", "-e", &format!("{}^{{commit}}", self.commit)],
        )
        .is_err()
        {
            // A shallow clone (CI's may be) has not the release's commit: fetch just it.
            git(repository, &["fetch", "--quiet", "origin", &self.commit]).with_context(|| {
                format!(
                    "release {}'s commit {} is not in this clone, nor could it be fetched \
                     (`git fetch --unshallow` gives the whole history)",
                    self.version, self.commit
                )
            })?;
        }
        if sources.join(".git").exists() {
            let head = git(sources, &["rev-parse", "HEAD"])?;
            if head == self.commit {
                return Ok(());
            }
            git(sources, &["checkout", "--quiet", "--detach", &self.commit])?;
            return Ok(());
        }
        // A folder wiped by hand leaves its worktree registered: forget it first.
        git(repository, &["worktree", "prune"])?;
        if let Some(parent) = sources.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let sources_text = sources.to_string_lossy();
        git(
            repository,
            &[
                "worktree",
                "add",
                "--detach",
                "--force",
                &sources_text,
                &self.commit,
            ],
        )?;
        Ok(())
    }
}

/// The Cargo build folder this lab binary was built in (`<target>/<profile>/paybus-lab`), if it
/// looks like one.
fn this_build_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let target = exe.parent()?.parent()?;
    target
        .join("debug/.fingerprint")
        .is_dir()
        .then(|| target.to_path_buf())
}

fn is_commit(text: &str) -> bool {
    text.len() >= 7 && text.len() <= 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn rev_parse(repository: &Path, commit: &str) -> anyhow::Result<String> {
    git(
        repository,
        &["rev-parse", "--verify", &format!("{commit}^{{commit}}")],
    )
}

/// `git <args>` in `dir`; its trimmed standard output.
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running git")?;
    if !output.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repository() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn the_default_is_the_release_below_this_one_with_the_commit_it_was_cut_from() {
        let release = Release::find(&repository(), None).unwrap();
        assert_ne!(release.version, THIS_VERSION);
        assert_eq!(release.commit.len(), 40, "{release:?}");
        let asked = Release::find(&repository(), Some(&release.version)).unwrap();
        assert_eq!(asked, release);
    }

    #[test]
    fn a_version_the_changelog_lacks_is_refused_naming_those_it_has() {
        let error = Release::find(&repository(), Some("9.9.9")).unwrap_err();
        let text = format!("{error:#}");
        assert!(text.contains(THIS_VERSION), "{text}");
        let error = Release::find(&repository(), Some(THIS_VERSION)).unwrap_err();
        assert!(format!("{error:#}").contains("not cut"), "{error:#}");
    }
}
