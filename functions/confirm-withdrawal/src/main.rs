//! The confirm-withdrawal function binary: a local consumer, or a Lambda when `AWS_LAMBDA_RUNTIME_API` is set.

fn main() -> std::process::ExitCode {
    paybus_runtime::function::main::<paybus_confirm_withdrawal::ConfirmWithdrawal>()
}
