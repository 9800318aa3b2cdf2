//! The catalog: every function paybus runs and deploys, in one list ([`FUNCTIONS`]), and every
//! workflow's audit checks ([`AUDIT`]).
//!
//! Adding a function is one new crate in `functions/<name>` (its handler implements
//! `paybus_runtime::function::Function`; a one-line `main.rs`) plus one line in [`FUNCTIONS`].
//! Everything else derives from the list: the queues ([`queues`]: what `paybus topology`
//! declares and `infra/rabbitmq/definitions.json` ships), the consumers `paybus run` starts
//! ([`register`]), the sweeper's jobs ([`jobs`]), the configuration page's groups
//! ([`settings`]), the README's function table ([`markdown_table`]) and the AWS SAM template
//! ([`sam`]); a test checks the shipped files and every crate in `functions/` against it.
//!
//! The sweeper (`functions/sweeper`) is not in the list: it is the scheduled function that runs
//! the listed functions' jobs.

pub mod sam;
pub mod settings;
mod yaml;

use std::sync::Arc;

use paybus_bus::{Services, held::Known, samples::BusSampler, topology::FunctionQueue};
use paybus_config::{ConfigError, Shards, Vars};
use paybus_maintenance::{
    HeldRelease, Job,
    auditor::{Auditor, AuditorConfig},
};
use paybus_ops::audit::{Check, ExternalCheck};
use paybus_runtime::{
    function::{BuildError, FunctionEntry},
    runner::Runner,
};

/// Every function, one line each.
pub static FUNCTIONS: &[FunctionEntry] = &[
    FunctionEntry::of::<paybus_canary::Canary>(),
    FunctionEntry::of::<paybus_confirm_withdrawal::ConfirmWithdrawal>(),
    FunctionEntry::of::<paybus_confirm_deposit::ConfirmDeposit>(),
    FunctionEntry::of::<paybus_deliver_webhook::DeliverWebhook>(),
    FunctionEntry::of::<paybus_grant_bonus::GrantBonus>(),
    FunctionEntry::of::<paybus_cancel_orders::CancelOrders>(),
    FunctionEntry::of::<paybus_match_deposit::MatchDeposit>(),
];

/// Every invariant `paybus audit` checks, one domain's checks per line.
pub static AUDIT: &[&[Check]] = &[
    paybus_ledger::audit::CHECKS,
    paybus_confirmations::audit::CHECKS,
    paybus_bonuses::audit::CHECKS,
    paybus_markets::audit::CHECKS,
    paybus_p2p::audit::CHECKS,
    paybus_partners::audit::CHECKS,
    // The ops trail itself: the hash chain of `ops_log`.
    paybus_ops::ops_log::CHECKS,
    // The dead-letter groups' counts against the NEW letters they count.
    paybus_bus::dead_letter::group_counts::CHECKS,
];

/// The queues of every function in the layout `shards` (what the topology declares): each
/// function's queue, or each of its shards. A process's layout is its settings'
/// (`BrokerSettings::shards`, from `PAYBUS_SHARDS`).
pub fn queues(shards: &Shards) -> Vec<FunctionQueue> {
    FUNCTIONS
        .iter()
        .flat_map(|f| f.queue.queues_in(shards))
        .collect()
}

/// Refuses a layout that names a function the catalog does not have (a typo would leave the
/// intended function unsharded without a word).
pub fn check_shards(shards: &Shards) -> Result<(), ConfigError> {
    match shards
        .iter()
        .find(|(name, _)| !FUNCTIONS.iter().any(|f| f.name == *name))
    {
        None => Ok(()),
        Some((name, _)) => Err(ConfigError {
            variable: Shards::VARIABLE,
            value: format!("{shards} (no function {name:?})"),
            expected: "catalog function names (paybus catalog) with their counts, e.g. confirm-withdrawal=4",
        }),
    }
}

/// Builds every function and adds it, with its jobs, to `runner` (`paybus run`).
pub fn register(runner: &mut Runner) -> Result<(), BuildError> {
    check_shards(&runner.services().settings.broker.shards)?;
    for function in FUNCTIONS {
        function.add_to(runner)?;
    }
    for job in jobs(runner.services())? {
        runner.add_job(job);
    }
    Ok(())
}

/// Every function's maintenance jobs (the sweeper's, besides the outbox relay), the
/// continuous auditor over [`AUDIT`], the release of messages held until a release read their
/// version, and the bus's sampler for the console's charts.
pub fn jobs(services: &Services) -> Result<Vec<Arc<dyn Job>>, BuildError> {
    let mut jobs: Vec<Arc<dyn Job>> = vec![Arc::new(
        Auditor::new(
            services.pool.clone(),
            audit_checks(),
            AuditorConfig::read(&services.settings.vars)?,
        )
        .with_external(external_checks(&services.settings.vars)?),
    )];
    for function in FUNCTIONS {
        jobs.extend(function.jobs(services)?);
    }
    jobs.push(Arc::new(HeldRelease::new(
        services.outbox.clone(),
        FUNCTIONS
            .iter()
            .map(|f| Known {
                function: f.name,
                version: f.message_version,
            })
            .collect(),
    )));
    jobs.push(Arc::new(BusSampler::new(
        services.pool.clone(),
        services.link.clone(),
        queues(&services.settings.broker.shards)
            .iter()
            .map(FunctionQueue::queue)
            .collect(),
    )));
    Ok(jobs)
}

/// Every function's checks against counterparties (W1's trades at the quote service), with
/// their settings from `vars`.
pub fn external_checks(vars: &Vars) -> Result<Vec<Arc<dyn ExternalCheck>>, BuildError> {
    let mut checks = Vec::new();
    for function in FUNCTIONS {
        checks.extend(function.external_checks(vars)?);
    }
    Ok(checks)
}

/// Every audit check, in order.
pub fn audit_checks() -> Vec<Check> {
    AUDIT
        .iter()
        .flat_map(|checks| checks.iter().copied())
        .collect()
}

/// The README's function table (markdown), generated from the list.
pub fn markdown_table() -> String {
    let mut table = String::from(
        "| function | consumes (routing key) | queue | dead letters |\n| --- | --- | --- | --- |\n",
    );
    for f in FUNCTIONS {
        table.push_str(&format!(
            "| `{}` | `{}` | `{}` | `{}` |\n",
            f.name,
            f.queue.routing_key,
            f.queue.queue(),
            f.queue.dead_letter_queue()
        ));
    }
    table
}
