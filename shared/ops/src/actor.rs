//! Who acted: the identity every ops action is recorded under (the ops log, four-eyes, the
//! dead-letter operations). A person is who the company's identity provider says (its issuer
//! and subject), shown by a name; a shared-secret (break-glass) token's holder and a partner's
//! API key are recorded as such, never as a person.

use serde::{Deserialize, Serialize};

paybus_db::column_enum! {
    /// How the actor proved who they are.
    #[derive(Hash)]
    pub enum AuthMethod {
        /// A token from the identity provider (the API, the CLI after `paybus login`), or a
        /// console session it signed in.
        Oidc,
        /// A shared-secret token (`PAYBUS_BREAK_GLASS`): anyone holding the secret can mint
        /// any name, so it is marked wherever it acts and is never one of four eyes.
        BreakGlass,
        /// A partner's API key (the partner API).
        PartnerKey,
    }
}

/// The issuer recorded for a break-glass token's holder.
pub const BREAK_GLASS_ISSUER: &str = "paybus:break-glass";
/// The issuer recorded for a partner's API key.
pub const PARTNER_KEY_ISSUER: &str = "paybus:partner-key";

/// Who acted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// The identity provider's `iss`; [`BREAK_GLASS_ISSUER`] or [`PARTNER_KEY_ISSUER`] for the
    /// others.
    pub issuer: String,
    /// The provider's `sub`: with the issuer, the person.
    pub subject: String,
    /// How people read it: the email, the username, or the subject.
    pub name: String,
    pub via: AuthMethod,
}

impl Actor {
    /// A person the identity provider vouches for.
    pub fn person(issuer: &str, subject: &str, name: &str) -> Self {
        Self {
            issuer: issuer.to_owned(),
            subject: subject.to_owned(),
            name: name.to_owned(),
            via: AuthMethod::Oidc,
        }
    }

    /// The holder of a break-glass token naming `subject`.
    pub fn break_glass(subject: &str) -> Self {
        Self {
            issuer: BREAK_GLASS_ISSUER.to_owned(),
            subject: subject.to_owned(),
            name: format!("{subject} (break-glass)"),
            via: AuthMethod::BreakGlass,
        }
    }

    /// A partner acting with its API key; `name` says which (`partner:7`, `partner:7 key 3`).
    pub fn partner(name: &str) -> Self {
        Self {
            issuer: PARTNER_KEY_ISSUER.to_owned(),
            subject: name.to_owned(),
            name: name.to_owned(),
            via: AuthMethod::PartnerKey,
        }
    }

    /// The same person as `issuer`/`subject` (four-eyes: the requester may not approve).
    pub fn is(&self, issuer: &str, subject: &str) -> bool {
        self.issuer == issuer && self.subject == subject
    }

    /// Whether this actor may be one of four eyes: only a person the provider vouches for.
    pub fn is_person(&self) -> bool {
        self.via == AuthMethod::Oidc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_person_is_an_issuer_and_a_subject_not_a_name() {
        let alice = Actor::person("https://idp.example", "u-1", "alice@example.com");
        let namesake = Actor::person("https://other.example", "u-1", "alice@example.com");
        assert!(alice.is("https://idp.example", "u-1"));
        assert!(!namesake.is("https://idp.example", "u-1"));
        assert!(alice.is_person());
        assert!(!Actor::break_glass("alice").is_person());
        assert!(!Actor::partner("partner:7").is_person());
        assert_eq!(AuthMethod::BreakGlass.to_string(), "BREAK_GLASS");
    }
}
