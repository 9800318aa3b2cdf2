//! The `api` binary: the HTTP API alone, behind API Gateway as a Lambda in AWS, or a plain
//! server elsewhere.

fn main() -> std::process::ExitCode {
    paybus_runtime::function::block_on(paybus_api::process::run())
}
