//! Idle memory: every function's own process, the sweeper, the API (`paybus serve`) and `paybus
//! run` (all of them in one process), started together on a fresh database and vhost and left
//! alone for `--idle-seconds`, then read from `/proc/<pid>/status`: resident memory (VmRSS),
//! its anonymous part (RssAnon: heap, stacks, the allocator's arenas), its file-backed part
//! (RssFile: mostly the binary's own pages), the threads, and the database connections each
//! holds open (from the server's process list, by the connection's client port). The target:
//! a function process idles under 30 MiB.

use std::{collections::BTreeMap, process::Stdio, time::Duration};

use anyhow::Context;
use paybus_testkit::TestEnv;
use tokio::process::{Child, Command};

use super::{BenchArgs, met};
use crate::chaos::fleet;

/// A function process's idle resident memory must stay under this (DEVELOPERS.md's target).
const FUNCTION_TARGET_KIB: u64 = 30 * 1024;

struct Idle {
    name: String,
    /// A function's own process (the target applies), not the API or the all-in-one.
    function: bool,
    child: Child,
}

/// What `/proc/<pid>/status` says of one process, KiB (threads: a count).
#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    rss: u64,
    anon: u64,
    file: u64,
    threads: u64,
}

fn memory_of(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    Some(Memory {
        rss: field("VmRSS:")?,
        anon: field("RssAnon:")?,
        file: field("RssFile:")?,
        threads: field("Threads:")?,
    })
}

/// The local ports of `pid`'s TCP connections (from `/proc/<pid>/net/tcp`'s inodes matched
/// to its open sockets), to count its database connections by the server's process list.
fn local_ports(pid: u32) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let inodes: Vec<String> = fds
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let (Some(local), Some(inode)) = (fields.get(1), fields.get(9))
                && inodes.iter().any(|i| i == inode)
                && let Some(port) = local.rsplit(':').next()
                && let Ok(port) = u16::from_str_radix(port, 16)
            {
                ports.push(port);
            }
        }
    }
    ports
}

pub(crate) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    // The soak's `--bin-dir`: the same binaries.
    let bin_dir = fleet::bin_dir(args.soak.bin_dir.as_deref())?;
    let mut binaries = fleet::binaries(&bin_dir, &[])?;
    binaries.push(fleet::Binary {
        name: "paybus run (everything)".to_owned(),
        path: bin_dir.join("paybus"),
        args: vec!["run".to_owned()],
    });
    let env = TestEnv::new().await;
    let idle = Duration::from_secs(args.idle_seconds);
    let mut processes = Vec::with_capacity(binaries.len());
    for binary in binaries {
        let child = Command::new(&binary.path)
            .args(&binary.args)
            .envs(env.env_vars())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.path.display()))?;
        processes.push(Idle {
            function: !binary.is_api() && binary.args.is_empty(),
            name: binary.name,
            child,
        });
    }
    println!(
        "{} processes started on database {}; idle for {idle:?}",
        processes.len(),
        env.db_name
    );
    tokio::time::sleep(idle).await;

    let connections: Vec<(u16, String)> = sqlx::query_as(
        "SELECT CAST(SUBSTRING_INDEX(host, ':', -1) AS UNSIGNED), COALESCE(db, '') \
         FROM information_schema.processlist WHERE host LIKE '%:%'",
    )
    .fetch_all(&env.db)
    .await?
    .into_iter()
    .map(|(port, db): (u64, String)| (u16::try_from(port).unwrap_or(0), db))
    .collect();
    let mut table = BTreeMap::new();
    for process in &processes {
        let Some(pid) = process.child.id() else {
            anyhow::bail!("{} exited while idle", process.name);
        };
        let memory =
            memory_of(pid).with_context(|| format!("reading {}'s memory", process.name))?;
        let ports = local_ports(pid);
        let held = connections
            .iter()
            .filter(|(port, db)| ports.contains(port) && *db == env.db_name)
            .count();
        table.insert(process.name.clone(), (process.function, memory, held));
    }
    for mut process in processes {
        let _ = process.child.kill().await;
    }

    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>8} {:>12}",
        "process", "RSS MiB", "anon MiB", "file MiB", "threads", "db conns"
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut worst_function = Memory::default();
    let mut worst_name = String::new();
    for (name, (function, memory, held)) in &table {
        println!(
            "{name:<28} {:>9.1} {:>9.1} {:>9.1} {:>8} {held:>12}",
            mib(memory.rss),
            mib(memory.anon),
            mib(memory.file),
            memory.threads
        );
        if *function && memory.rss > worst_function.rss {
            worst_function = *memory;
            worst_name.clone_from(name);
        }
    }
    println!(
        "largest function process: {worst_name}, {:.1} MiB = {:.2} of the 30 MiB target: {}",
        mib(worst_function.rss),
        worst_function.rss as f64 / FUNCTION_TARGET_KIB as f64,
        met(worst_function.rss < FUNCTION_TARGET_KIB)
    );
    Ok(())
}
