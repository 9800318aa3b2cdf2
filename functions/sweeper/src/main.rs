//! The sweeper binary: the outbox relay and every function's maintenance jobs, from the
//! catalog. A scheduled Lambda (EventBridge) in AWS, timers locally.

fn main() -> std::process::ExitCode {
    paybus_platform::function::sweeper_main(paybus_catalog::jobs)
}
