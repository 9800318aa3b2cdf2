//! The dead-letter recorder binary: in AWS a Lambda on every function's dead-letter queue and
//! `paybus.unrouted`; locally a consumer of each (the catalog's functions).

fn main() -> std::process::ExitCode {
    paybus_runtime::function::dead_letters_main(paybus_catalog::queues)
}
