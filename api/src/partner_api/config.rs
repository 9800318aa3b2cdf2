//! The partner API's settings (read by [`crate::ApiConfig`]).

use paybus_config::{ConfigError, Secret, Setting, Vars};

pub const VAR_KEY_HASH_KEY: Setting = Setting {
    name: "PAYBUS_PARTNER_KEY_HASH_KEY",
    default: "unset",
    about: "the server key partner API keys are hashed under (HMAC-SHA256, ≥ 32 chars; a \
            dump of `partner_api_keys` without it cannot test a key); unset: the partner API \
            and key creation answer 503 (`infra/run.sh` generates a development one)",
};
pub const VAR_RATE_LIMIT_PER_SECOND: Setting = Setting {
    name: "PAYBUS_PARTNER_RATE_LIMIT_PER_SECOND",
    default: "`50`",
    about: "requests per second a partner may make to the partner API, per API process \
            (a partner's own `partners.rate_limit_per_second` overrides it); past it 429 with \
            `Retry-After` (at least 1)",
};
pub const VAR_RATE_LIMIT_BURST: Setting = Setting {
    name: "PAYBUS_PARTNER_RATE_LIMIT_BURST",
    default: "`100`",
    about: "requests a partner may make at once before the per-second rate applies \
            (`partners.rate_limit_burst` overrides it) (at least 1)",
};

pub const SETTINGS: &[Setting] = &[
    VAR_KEY_HASH_KEY,
    VAR_RATE_LIMIT_PER_SECOND,
    VAR_RATE_LIMIT_BURST,
];

/// A partner's request rate: `per_second` sustained, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    pub per_second: u32,
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            per_second: 50,
            burst: 100,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartnerApiConfig {
    pub key_hash_key: Option<Secret>,
    /// The limit of partners without their own.
    pub rate_limit: RateLimit,
}

impl PartnerApiConfig {
    pub fn read(env: &Vars) -> Result<Self, ConfigError> {
        let defaults = RateLimit::default();
        let positive = |n: &u32| *n > 0;
        Ok(Self {
            key_hash_key: env.secret(VAR_KEY_HASH_KEY, 32)?,
            rate_limit: RateLimit {
                per_second: env.parse(
                    VAR_RATE_LIMIT_PER_SECOND,
                    defaults.per_second,
                    "a positive integer (requests per second)",
                    positive,
                )?,
                burst: env.parse(
                    VAR_RATE_LIMIT_BURST,
                    defaults.burst,
                    "a positive integer (requests)",
                    positive,
                )?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_documented_default_is_the_default() {
        for (name, environment) in paybus_config::setting::documented_defaults(SETTINGS) {
            assert_eq!(
                PartnerApiConfig::read(&Vars::new(environment)),
                Ok(PartnerApiConfig::default()),
                "{name}"
            );
        }
    }

    #[test]
    fn a_zero_rate_is_refused_naming_the_variable() {
        let env = Vars::new(
            [(VAR_RATE_LIMIT_PER_SECOND.name.to_owned(), "0".to_owned())]
                .into_iter()
                .collect(),
        );
        assert_eq!(
            PartnerApiConfig::read(&env).unwrap_err().variable,
            VAR_RATE_LIMIT_PER_SECOND.name
        );
    }
}
