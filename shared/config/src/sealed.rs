//! Secrets sealed at rest: AES-256-GCM under a key the database never sees, so a dump, a
//! replica or a backup of the tables holds no usable secret (partner webhook secrets first).
//!
//! A [`Sealer`] holds the *current* key, which seals, and any number of older keys, which only
//! open: rotating is "make the new one current, keep the former as old until
//! `paybus secrets rotate-key` has re-sealed every row, then drop it". Each ciphertext is stored
//! beside its key's id (the first 8 hex digits of the key's SHA-256), so rows under several keys
//! live side by side during a rotation.
//!
//! Every seal binds the row it belongs to as additional authenticated data (e.g.
//! `partner_webhook_secrets:42`): a ciphertext copied into another row does not open there.
//! Nonces are 96 random bits per seal, good for far more than 2^32 seals per key, orders of
//! magnitude above the webhook secrets paybus will ever write. The keys are
//! `PAYBUS_SECRETS_KEY` and `PAYBUS_SECRETS_OLD_KEYS` (docs/configuration.md).

use std::fmt;

use aes_gcm::{
    Aes256Gcm, KeyInit, Nonce,
    aead::{Aead, OsRng, Payload, rand_core::RngCore},
};
use base64::Engine;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::{ConfigError, Secret, Setting, Vars};

pub const VAR_SECRETS_KEY: Setting = Setting {
    name: "PAYBUS_SECRETS_KEY",
    default: "unset",
    about: "the key that seals secrets at rest (partner webhook secrets; AES-256-GCM): 32 bytes \
            as 64 hex digits or standard base64. Unset: deliver-webhook sends nothing (ERROR at \
            start; deliveries wait, unattempted), the API's partner create answers 503, and \
            `paybus migrate` stops while a plaintext webhook secret is left (`infra/run.sh` \
            generates a development one)",
};
pub const VAR_SECRETS_OLD_KEYS: Setting = Setting {
    name: "PAYBUS_SECRETS_OLD_KEYS",
    default: "unset",
    about: "earlier `PAYBUS_SECRETS_KEY` values, comma-separated, that still open what they \
            sealed during a key rotation; `paybus secrets rotate-key` re-seals those rows under \
            the current key, after which they can go",
};

/// What [`Sealer::read`] reads, in the order the page lists them.
pub const SETTINGS: &[Setting] = &[VAR_SECRETS_KEY, VAR_SECRETS_OLD_KEYS];

/// The form a key is written in (the settings' expected form).
const KEY_FORM: &str = "32 bytes as 64 hex digits or standard base64";

/// The shortest a key may be written (base64 of 32 bytes; hex is 64).
pub const KEY_MIN_CHARS: usize = 44;

/// Bytes of an AES-256 key.
pub const KEY_BYTES: usize = 32;
/// Bytes of an AES-GCM nonce.
pub const NONCE_BYTES: usize = 12;

/// One ciphertext as it is stored: which key sealed it, its nonce, and the ciphertext with
/// its 16-byte tag at the end.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealed")
            .field("key_id", &self.key_id)
            .field("ciphertext_bytes", &self.ciphertext.len())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Sealed under a key this process was not given (an old key dropped too early?).
    #[error(
        "sealed under key {key_id}, which is neither PAYBUS_SECRETS_KEY nor one of \
         PAYBUS_SECRETS_OLD_KEYS"
    )]
    UnknownKey { key_id: String },
    /// Wrong key for its id, another row's ciphertext (the AAD differs), or altered bytes.
    #[error("sealed value under key {key_id} does not open: altered, or copied from another row")]
    DoesNotOpen { key_id: String },
    #[error("sealed value has a {len}-byte nonce; AES-GCM takes {NONCE_BYTES}")]
    BadNonce { len: usize },
    #[error("the operating system's random generator failed")]
    Random,
    #[error("cannot seal: the plaintext is too long for AES-GCM")]
    TooLong,
}

#[derive(Clone)]
struct Key {
    id: String,
    cipher: Aes256Gcm,
}

impl Key {
    fn new(bytes: &[u8; KEY_BYTES]) -> Self {
        Self {
            id: key_id(bytes),
            cipher: Aes256Gcm::new(bytes.into()),
        }
    }
}

/// The id a key is stored under: the first 8 hex digits of its SHA-256 (it names the key
/// without revealing it).
pub fn key_id(key: &[u8; KEY_BYTES]) -> String {
    hex::encode(Sha256::digest(key))[..8].to_owned()
}

/// Seals with the current key, opens with any key it holds. Build it once at start-up.
#[derive(Clone)]
pub struct Sealer {
    current: Key,
    /// Older keys, open only (never the current one again).
    old: Vec<Key>,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Ids only: they name keys without revealing them.
        f.debug_struct("Sealer")
            .field("current", &self.current.id)
            .field("old", &self.old.iter().map(|k| &k.id).collect::<Vec<_>>())
            .finish()
    }
}

/// Two sealers are the same when they hold the same keys (ids are hashes of the keys).
impl PartialEq for Sealer {
    fn eq(&self, other: &Self) -> bool {
        self.current.id == other.current.id
            && self
                .old
                .iter()
                .map(|k| &k.id)
                .eq(other.old.iter().map(|k| &k.id))
    }
}

impl Eq for Sealer {}

impl Sealer {
    /// A sealer whose current key is `current`, opening also what `old` sealed.
    pub fn new(current: &[u8; KEY_BYTES], old: &[[u8; KEY_BYTES]]) -> Self {
        let current = Key::new(current);
        let mut keys: Vec<Key> = Vec::new();
        for key in old.iter().map(Key::new) {
            if key.id != current.id && keys.iter().all(|k| k.id != key.id) {
                keys.push(key);
            }
        }
        Self { current, old: keys }
    }

    /// The sealer of `current` (`PAYBUS_SECRETS_KEY` as its reader read it with `Vars`'s
    /// secret reader and [`KEY_MIN_CHARS`]: each process that seals names the key itself, so
    /// the template's secrets check sees who reads it) with the old keys of `vars`
    /// (`PAYBUS_SECRETS_OLD_KEYS`). `None` when `current` is; a malformed key names its
    /// variable (never its value). Old keys without a current one are refused: nothing could
    /// seal.
    pub fn read(current: Option<Secret>, vars: &Vars) -> Result<Option<Self>, ConfigError> {
        let old = match vars.get(VAR_SECRETS_OLD_KEYS) {
            None => Vec::new(),
            Some(raw) => raw
                .split(',')
                .map(|part| parse_key(part.trim()).ok_or_else(|| hidden(VAR_SECRETS_OLD_KEYS)))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let Some(current) = current else {
            if old.is_empty() {
                return Ok(None);
            }
            return Err(ConfigError {
                variable: VAR_SECRETS_KEY.name,
                value: String::new(),
                expected: "a current key whenever PAYBUS_SECRETS_OLD_KEYS is set",
            });
        };
        let raw = current.expose();
        let current = parse_key(raw).ok_or_else(|| hidden(VAR_SECRETS_KEY))?;
        let old: Vec<[u8; KEY_BYTES]> = old.iter().map(|k| **k).collect();
        Ok(Some(Self::new(&current, &old)))
    }

    /// The id of the key that seals.
    pub fn current_key_id(&self) -> &str {
        &self.current.id
    }

    /// Whether `key_id` is the current key's (a row under another key is due for re-sealing).
    pub fn is_current(&self, key_id: &str) -> bool {
        self.current.id == key_id
    }

    /// Seals `plaintext` for the row `aad` names, under the current key and a fresh nonce.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Sealed, SealError> {
        let mut nonce = [0u8; NONCE_BYTES];
        random_bytes(&mut nonce)?;
        let ciphertext = self
            .current
            .cipher
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .map_err(|_| SealError::TooLong)?;
        Ok(Sealed {
            key_id: self.current.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// The plaintext of `sealed`, if it was sealed for the row `aad` names under a key this
    /// sealer holds. Wiped from memory when dropped.
    pub fn open(&self, sealed: &Sealed, aad: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
        let key = std::iter::once(&self.current)
            .chain(&self.old)
            .find(|k| k.id == sealed.key_id)
            .ok_or_else(|| SealError::UnknownKey {
                key_id: sealed.key_id.clone(),
            })?;
        let nonce: [u8; NONCE_BYTES] =
            sealed
                .nonce
                .as_slice()
                .try_into()
                .map_err(|_| SealError::BadNonce {
                    len: sealed.nonce.len(),
                })?;
        key.cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad,
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| SealError::DoesNotOpen {
                key_id: sealed.key_id.clone(),
            })
    }

    /// `sealed` opened and sealed again under the current key (key rotation).
    pub fn reseal(&self, sealed: &Sealed, aad: &[u8]) -> Result<Sealed, SealError> {
        let plaintext = self.open(sealed, aad)?;
        self.seal(&plaintext, aad)
    }
}

/// Fills `buf` from the operating system's random generator (nonces, generated secrets).
pub fn random_bytes(buf: &mut [u8]) -> Result<(), SealError> {
    OsRng.try_fill_bytes(buf).map_err(|_| SealError::Random)
}

/// A key as written in a setting: 64 hex digits or standard base64 of 32 bytes.
fn parse_key(raw: &str) -> Option<Zeroizing<[u8; KEY_BYTES]>> {
    let bytes = Zeroizing::new(if raw.len() == 2 * KEY_BYTES {
        hex::decode(raw).ok()?
    } else {
        base64::engine::general_purpose::STANDARD.decode(raw).ok()?
    });
    let key: [u8; KEY_BYTES] = bytes.as_slice().try_into().ok()?;
    Some(Zeroizing::new(key))
}

fn hidden(setting: Setting) -> ConfigError {
    ConfigError {
        variable: setting.name,
        value: "***".to_owned(),
        expected: KEY_FORM,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const A: [u8; 32] = [7; 32];
    const B: [u8; 32] = [9; 32];

    fn read(pairs: &[(Setting, &str)]) -> Result<Option<Sealer>, ConfigError> {
        let vars = Vars::new(
            pairs
                .iter()
                .map(|(s, v)| (s.name.to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        );
        Sealer::read(vars.secret(VAR_SECRETS_KEY, KEY_MIN_CHARS)?, &vars)
    }

    #[test]
    fn what_is_sealed_opens_for_its_row_only() {
        let sealer = Sealer::new(&A, &[]);
        let sealed = sealer
            .seal(b"whsec-bytes", b"partner_webhook_secrets:1")
            .unwrap();
        assert_ne!(sealed.ciphertext, b"whsec-bytes");
        assert_eq!(
            sealer
                .open(&sealed, b"partner_webhook_secrets:1")
                .unwrap()
                .as_slice(),
            b"whsec-bytes"
        );
        assert_eq!(
            sealer.open(&sealed, b"partner_webhook_secrets:2"),
            Err(SealError::DoesNotOpen {
                key_id: sealed.key_id.clone()
            })
        );
        let mut altered = sealed.clone();
        altered.ciphertext[0] ^= 1;
        assert!(sealer.open(&altered, b"partner_webhook_secrets:1").is_err());
    }

    #[test]
    fn two_seals_of_one_secret_differ() {
        let sealer = Sealer::new(&A, &[]);
        let one = sealer.seal(b"same", b"row").unwrap();
        let two = sealer.seal(b"same", b"row").unwrap();
        assert_ne!(one.nonce, two.nonce);
        assert_ne!(one.ciphertext, two.ciphertext);
    }

    #[test]
    fn an_old_key_opens_and_a_reseal_moves_to_the_current_one() {
        let before = Sealer::new(&A, &[]);
        let sealed = before.seal(b"secret", b"row").unwrap();
        let after = Sealer::new(&B, &[A]);
        assert!(!after.is_current(&sealed.key_id));
        let resealed = after.reseal(&sealed, b"row").unwrap();
        assert!(after.is_current(&resealed.key_id));
        assert_eq!(after.open(&resealed, b"row").unwrap().as_slice(), b"secret");
        let without_old = Sealer::new(&B, &[]);
        assert_eq!(
            without_old.open(&sealed, b"row"),
            Err(SealError::UnknownKey { key_id: key_id(&A) })
        );
    }

    #[test]
    fn keys_are_read_as_hex_or_base64_and_never_echoed() {
        let hex_key = hex::encode(A);
        let base64_key = base64::engine::general_purpose::STANDARD.encode(B);
        assert_eq!(read(&[]).unwrap(), None);
        let sealer = read(&[
            (VAR_SECRETS_KEY, &hex_key),
            (VAR_SECRETS_OLD_KEYS, &format!("{base64_key}, {hex_key}")),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(sealer, Sealer::new(&A, &[B]));
        assert!(!format!("{sealer:?}").contains(&hex_key));
        let short = read(&[(VAR_SECRETS_KEY, &"0".repeat(50))]).unwrap_err();
        assert_eq!(
            (short.variable, short.value.as_str()),
            (VAR_SECRETS_KEY.name, "***")
        );
        let bad_old = read(&[(VAR_SECRETS_KEY, &hex_key), (VAR_SECRETS_OLD_KEYS, "x")]);
        assert_eq!(bad_old.unwrap_err().variable, VAR_SECRETS_OLD_KEYS.name);
        let old_only = read(&[(VAR_SECRETS_OLD_KEYS, &hex_key)]).unwrap_err();
        assert_eq!(old_only.variable, VAR_SECRETS_KEY.name);
    }
}
