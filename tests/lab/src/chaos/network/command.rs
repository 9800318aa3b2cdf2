//! Running the kernel's network tools (`ip`, `tc`, `nft`, `ss`, `kill`) with their output
//! captured, so that a failure names the command line and what the tool said.

use std::{
    ffi::OsString,
    fmt,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail};
use tokio::io::AsyncWriteExt;

/// How long one tool may take: they answer in milliseconds, so a hang is a finding, not a wait.
const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

/// Where `tool` is: on the `PATH`, or in the sbin folders a non-login `PATH` lacks (`ip`,
/// `tc` and `nft` live in `/usr/sbin`; `infra/local/env.sh` adds it for the scripts, but the
/// harness may be started from anywhere).
pub(super) fn find(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|candidate| candidate.is_file())
}

/// Which Debian package brings a tool (for the error that says what to install).
fn package_of(tool: &str) -> &'static str {
    match tool {
        "nft" => "nftables",
        "kill" => "procps",
        _ => "iproute2",
    }
}

/// One command line: a tool (resolved when it runs) and its arguments, optionally run inside a
/// network namespace (`ip netns exec NAME tool ...`) and fed `stdin`.
#[derive(Debug, Clone)]
pub(super) struct Line {
    namespace: Option<String>,
    tool: &'static str,
    args: Vec<String>,
    stdin: Option<String>,
}

impl Line {
    pub(super) fn new(tool: &'static str) -> Self {
        Self {
            namespace: None,
            tool,
            args: Vec::new(),
            stdin: None,
        }
    }

    /// `ip netns exec <namespace> <tool> ...`: `ip` enters the namespace and execs the tool.
    pub(super) fn inside(namespace: &str, tool: &'static str) -> Self {
        Self {
            namespace: Some(namespace.to_owned()),
            ..Self::new(tool)
        }
    }

    pub(super) fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub(super) fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub(super) fn stdin(mut self, text: impl Into<String>) -> Self {
        self.stdin = Some(text.into());
        self
    }

    /// The program to start and its arguments, every tool resolved to its path.
    fn argv(&self) -> anyhow::Result<(PathBuf, Vec<OsString>)> {
        let tool = resolve(self.tool)?;
        Ok(match &self.namespace {
            None => (tool, self.args.iter().map(OsString::from).collect()),
            Some(namespace) => {
                let mut argv: Vec<OsString> = ["netns", "exec", namespace.as_str()]
                    .into_iter()
                    .map(OsString::from)
                    .collect();
                argv.push(tool.into_os_string());
                argv.extend(self.args.iter().map(OsString::from));
                (resolve("ip")?, argv)
            }
        })
    }

    /// Runs it; its stdout, or an error naming the command line, its exit and its stderr.
    pub(super) async fn run(&self) -> anyhow::Result<String> {
        let (program, argv) = self.argv()?;
        let mut child = tokio::process::Command::new(&program)
            .args(&argv)
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start `{self}`"))?;
        if let (Some(text), Some(mut stdin)) = (&self.stdin, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .await
                .with_context(|| format!("while feeding `{self}` its input"))?;
        }
        let output = tokio::time::timeout(TOOL_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| format!("`{self}` did not finish within {TOOL_TIMEOUT:?}"))?
            .with_context(|| format!("while waiting for `{self}`"))?;
        self.judge(output)
    }

    /// [`run`](Self::run) for `Drop`, where there is no runtime to await on.
    pub(super) fn run_blocking(&self) -> anyhow::Result<String> {
        let (program, argv) = self.argv()?;
        let output = std::process::Command::new(&program)
            .args(&argv)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot start `{self}`"))?;
        self.judge(output)
    }

    fn judge(&self, output: std::process::Output) -> anyhow::Result<String> {
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!(
            "`{self}` failed ({}): {}",
            output.status,
            stderr.trim().lines().collect::<Vec<_>>().join(" / ")
        )
    }
}

fn resolve(tool: &str) -> anyhow::Result<PathBuf> {
    find(tool).with_context(|| {
        format!(
            "`{tool}` not found (Debian package {}; infra/local/install.sh installs it)",
            package_of(tool)
        )
    })
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(namespace) = &self.namespace {
            write!(f, "ip netns exec {namespace} ")?;
        }
        f.write_str(self.tool)?;
        for arg in &self.args {
            if arg.contains(char::is_whitespace) {
                write!(f, " '{arg}'")?;
            } else {
                write!(f, " {arg}")?;
            }
        }
        if self.stdin.is_some() {
            f.write_str(" <<input")?;
        }
        Ok(())
    }
}

/// Whether a tool's error says the thing to remove is already gone (cleanup is idempotent).
pub(super) fn is_gone(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}");
    [
        "Cannot find device",
        "No such file or directory",
        "Cannot assign requested address",
        "does not exist",
        "No such process",
    ]
    .iter()
    .any(|gone| text.contains(gone))
}

/// Whether `/proc/<pid>` exists: a run whose pid is gone left what carries its name behind.
pub(super) fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}
