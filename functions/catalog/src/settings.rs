//! Every setting the platform, the workflows' domains and the catalog's functions read, grouped
//! as the configuration page (`docs/configuration.md`) shows them. The API's own settings are
//! added by `paybus settings`: the API is built on this crate, so this list cannot name it.

use paybus_platform::setting::SettingGroup;

/// The page's sections, in order: what every process reads first, then each workflow's.
pub const GROUPS: &[SettingGroup] = &[
    SettingGroup {
        title: "Database, broker and logs",
        read_by: "Read by every process (`paybus_platform::config::Settings`).",
        settings: paybus_platform::config::SETTINGS,
    },
    SettingGroup {
        title: "Secrets from AWS",
        read_by: "Read at start-up, before every other setting (`paybus_platform::secrets`): \
                  how a Lambda gets a secret without an environment variable holding it.",
        settings: paybus_platform::secrets::SETTINGS,
    },
    SettingGroup {
        title: "Secrets at rest",
        read_by: "Read by deliver-webhook, the API (partner create) and `paybus migrate` / the \
                  migrate Lambda (`paybus_platform::sealed::Sealer`), and by `paybus secrets \
                  rotate-key`.",
        settings: paybus_platform::sealed::SETTINGS,
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
    SettingGroup {
        title: "bonuses (W3): grant-bonus",
        read_by: "Read by grant-bonus and its sweeper jobs (`paybus_grant_bonus::config`).",
        settings: paybus_grant_bonus::config::SETTINGS,
    },
    SettingGroup {
        title: "markets (W4): cancel-orders",
        read_by: "Read by cancel-orders (`paybus_cancel_orders::config`).",
        settings: paybus_cancel_orders::config::SETTINGS,
    },
    SettingGroup {
        title: "Partner webhooks: deliver-webhook",
        read_by: "Read by deliver-webhook (`paybus_deliver_webhook::config`), which delivers \
                  the notifications of p2p and confirmations.",
        settings: paybus_deliver_webhook::config::SETTINGS,
    },
    SettingGroup {
        title: "The continuous auditor",
        read_by: "Read by the sweeper's auditor job (`paybus_platform::auditor`), in \
                  `paybus run` and the sweeper Lambda.",
        settings: paybus_platform::auditor::SETTINGS,
    },
];
