//! Every setting the platform, the workflows' domains and the catalog's functions read, grouped
//! as the configuration page (`docs/configuration.md`) shows them: the platform's and the
//! domains' here, each function's from its `Function` impl. The API's own settings are added by
//! `paybus settings`: the API is built on this crate, so this list cannot name it.

use paybus_config::setting::SettingGroup;

use crate::FUNCTIONS;

/// The page's sections, in order: what every process reads first, the domains', each catalog
/// function's own (in the catalog's order), then the auditor's.
pub fn groups() -> Vec<SettingGroup> {
    let mut groups = SHARED.to_vec();
    groups.extend(FUNCTIONS.iter().filter_map(|function| function.settings));
    groups.push(AUDITOR);
    groups
}

/// What every process reads, and the domains' settings (read by the API and a function alike).
const SHARED: &[SettingGroup] = &[
    SettingGroup {
        title: "Database, broker and logs",
        read_by: "Read by every process (`paybus_config::Settings`).",
        settings: paybus_config::SETTINGS,
    },
    SettingGroup {
        title: "Secrets from AWS",
        read_by: "Read at start-up, before every other setting (`paybus_config::secrets`): \
                  how a Lambda gets a secret without an environment variable holding it.",
        settings: paybus_config::secrets::SETTINGS,
    },
    SettingGroup {
        title: "Secrets at rest",
        read_by: "Read by deliver-webhook, the API (partner create) and `paybus migrate` / the \
                  migrate Lambda (`paybus_config::sealed::Sealer`), and by `paybus secrets \
                  rotate-key`.",
        settings: paybus_config::sealed::SETTINGS,
    },
    SettingGroup {
        title: "p2p (W1): matching and the quote service",
        read_by: "Read by the API (inline matching) and match-deposit \
                  (`paybus_p2p::MatchingConfig`).",
        settings: paybus_p2p::config::SETTINGS,
    },
    SettingGroup {
        title: "bonuses (W3): the bonus rules",
        read_by: "Read by the API's payment completion (`paybus_bonuses::BonusRules`).",
        settings: paybus_bonuses::completion::SETTINGS,
    },
];

/// The continuous auditor's, last: a job of the sweeper over every workflow.
const AUDITOR: SettingGroup = SettingGroup {
    title: "The continuous auditor",
    read_by: "Read by the sweeper's auditor job (`paybus_maintenance::auditor`), in \
              `paybus run` and the sweeper Lambda.",
    settings: paybus_maintenance::auditor::SETTINGS,
};
