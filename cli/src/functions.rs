//! Every function this build of paybus runs: the one list `paybus run` and `paybus topology`
//! read, so the queues declared and the consumers started cannot drift apart.

use paybus_shared::bus::{Handler, Runner, topology::FunctionQueue};

pub fn queues() -> Vec<FunctionQueue> {
    vec![
        paybus_canary::Canary::queue(),
        paybus_confirm_withdrawal::ConfirmWithdrawal::queue(),
        paybus_confirm_deposit::ConfirmDeposit::queue(),
    ]
}

pub fn register(runner: &mut Runner) {
    runner.add_function(paybus_canary::Canary);
    runner.add_function(paybus_confirm_withdrawal::ConfirmWithdrawal);
    runner.add_function(paybus_confirm_deposit::ConfirmDeposit);
    for job in paybus_sweeper::jobs(runner.services()) {
        runner.add_job(job);
    }
}
