//! The sweeper binary: the outbox relay and every function's maintenance jobs, from the
//! catalog. A scheduled Lambda (EventBridge) in AWS, timers locally.

/// Why not glibc's: under the soak, this process's anonymous memory grows through every window
/// on glibc while its live heap stays flat; the workspace's Cargo.toml says more.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    paybus_runtime::function::sweeper_main(paybus_catalog::jobs)
}
