//! The sweeper binary: the outbox relay and every function's maintenance jobs, from the
//! catalog. A scheduled Lambda (EventBridge) in AWS, timers locally.

/// Why not glibc's: the soak (docs/benchmarks.md, 2026-12-05) saw this process's anonymous
/// memory grow through every window, its live heap flat; the workspace's Cargo.toml says more.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    paybus_platform::function::sweeper_main(paybus_catalog::jobs)
}
