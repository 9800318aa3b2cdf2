//! The `migrate` binary: migrations and the catalog's topology, once (a CloudFormation custom
//! resource in AWS).

fn main() -> std::process::ExitCode {
    paybus_migrate::main()
}
