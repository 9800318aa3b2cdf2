//! A partner's webhook signing secrets, sealed at rest in `partner_webhook_secrets` (the
//! migration's header comment is the reference) with the platform's [`Sealer`].
//!
//! A secret is 32 random bytes shown to the partner once as `whsec_<base64>`, the Standard
//! Webhooks form; a legacy secret (16–255 bytes given at creation) is its bytes as they are.
//! Rotation keeps the earlier secrets signing for an overlap, so a partner can switch its
//! verifier at leisure: every unexpired secret signs each delivery.

use std::{fmt, time::Duration};

use base64::Engine;
use paybus_config::sealed::{self, SealError, Sealed, Sealer};
use paybus_ops::actor::Actor;
use paybus_ops::ops_log::{self, Entry};
use paybus_retry::clock::micros;
use sqlx::{Connection, MySqlConnection};
use zeroize::Zeroizing;

/// The Standard Webhooks prefix of a secret as partners see it.
pub const PREFIX: &str = "whsec_";
/// Bytes of a generated secret.
pub const SECRET_BYTES: usize = 32;
/// The length bounds of a legacy secret's bytes.
pub const LEGACY_BYTES: std::ops::RangeInclusive<usize> = 16..=255;

/// A secret as it is shown to its partner, once (`whsec_…`). Its `Debug` hides the value.
pub struct RevealedSecret(Zeroizing<String>);

impl RevealedSecret {
    /// The `whsec_` string to hand to the partner.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RevealedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RevealedSecret(***)")
    }
}

/// A secret's bytes (the HMAC key), wiped when dropped.
pub type SecretKey = Zeroizing<Vec<u8>>;

#[derive(Debug, thiserror::Error)]
pub enum WebhookSecretError {
    #[error("partner {0} not found")]
    PartnerNotFound(u64),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// A secret given by an admin that is neither a `whsec_<base64>` value nor a legacy string,
/// each of 16 to 255 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a whsec_<base64> secret nor a string of 16 to 255 bytes")]
pub struct InvalidSecret;

/// The additional authenticated data binding a sealed secret to its partner.
pub fn aad(partner_id: u64) -> Vec<u8> {
    format!("partner_webhook_secrets:{partner_id}").into_bytes()
}

/// A new random secret: its key and its `whsec_` form.
pub fn generate() -> Result<(SecretKey, RevealedSecret), SealError> {
    let mut key = Zeroizing::new(vec![0u8; SECRET_BYTES]);
    sealed::random_bytes(&mut key)?;
    let revealed = reveal(&key);
    Ok((key, revealed))
}

/// A key in its `whsec_<base64>` form.
pub fn reveal(key: &[u8]) -> RevealedSecret {
    RevealedSecret(Zeroizing::new(format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )))
}

/// The key of a secret as given by an admin: a `whsec_<base64>` value (of 16 to 255 bytes)
/// is decoded; anything else is a legacy secret whose bytes are the key (16 to 255).
pub fn parse(raw: &str) -> Result<SecretKey, InvalidSecret> {
    let key = match raw.strip_prefix(PREFIX) {
        Some(encoded) => Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| InvalidSecret)?,
        ),
        None => Zeroizing::new(raw.as_bytes().to_vec()),
    };
    if !LEGACY_BYTES.contains(&key.len()) {
        return Err(InvalidSecret);
    }
    Ok(key)
}

/// Seals `key` as the partner's newest secret (no expiry), in the caller's transaction.
pub async fn insert(
    conn: &mut MySqlConnection,
    sealer: &Sealer,
    partner_id: u64,
    key: &[u8],
) -> Result<(), WebhookSecretError> {
    let sealed = sealer.seal(key, &aad(partner_id))?;
    sqlx::query(
        "INSERT INTO partner_webhook_secrets (partner_id, key_id, nonce, ciphertext) \
         VALUES (?, ?, ?, ?)",
    )
    .bind(partner_id)
    .bind(&sealed.key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .execute(conn)
    .await?;
    Ok(())
}

/// Gives the partner a new current secret; its earlier unexpired secrets keep signing for
/// `overlap` more (one that expires sooner keeps its own end). Logged in the ops log
/// (`partner.webhook_secret.rotate`, by `actor`, never the secret). Returns the new secret,
/// to be shown once. One transaction, under the partner row's lock so two rotations queue.
pub async fn rotate(
    conn: &mut MySqlConnection,
    sealer: &Sealer,
    partner_id: u64,
    overlap: Duration,
    actor: &Actor,
) -> Result<RevealedSecret, WebhookSecretError> {
    let mut tx = conn.begin().await?;
    let exists: Option<(u64,)> = sqlx::query_as("SELECT id FROM partners WHERE id = ? FOR UPDATE")
        .bind(partner_id)
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Err(WebhookSecretError::PartnerNotFound(partner_id));
    }
    let overlap_micros = micros(overlap);
    let expiring = sqlx::query(
        "UPDATE partner_webhook_secrets \
         SET expires_at = NOW(6) + INTERVAL ? MICROSECOND \
         WHERE partner_id = ? \
           AND (expires_at IS NULL OR expires_at > NOW(6) + INTERVAL ? MICROSECOND)",
    )
    .bind(overlap_micros)
    .bind(partner_id)
    .bind(overlap_micros)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let (key, revealed) = generate()?;
    insert(&mut tx, sealer, partner_id, &key).await?;
    ops_log::append(
        &mut tx,
        &Entry {
            actor,
            action: "partner.webhook_secret.rotate",
            subject: &format!("partner:{partner_id}"),
            detail: &serde_json::json!({
                "overlap_seconds": overlap.as_secs(),
                "earlier_secrets_expiring": expiring,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(revealed)
}

/// The secrets that sign a partner's deliveries now, newest (the current one) first.
#[derive(Clone)]
pub struct SigningSecrets(Vec<SecretKey>);

impl SigningSecrets {
    /// The current secret (it signs `X-Paybus-Signature` too).
    pub fn current(&self) -> Option<&[u8]> {
        self.0.first().map(|k| k.as_slice())
    }

    /// Every unexpired secret, newest first.
    pub fn all(&self) -> impl Iterator<Item = &[u8]> {
        self.0.iter().map(|k| k.as_slice())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SigningSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningSecrets({} secret(s))", self.0.len())
    }
}

#[derive(sqlx::FromRow)]
struct SealedRow {
    key_id: String,
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
}

impl From<SealedRow> for Sealed {
    fn from(row: SealedRow) -> Self {
        Sealed {
            key_id: row.key_id,
            nonce: row.nonce,
            ciphertext: row.ciphertext,
        }
    }
}

/// The partner's unexpired secrets (as of `now`, the kit's clock: NULL for the database's),
/// opened. `Ok(Err(_))` when one does not open (a key missing from the settings): the
/// delivery fails that attempt rather than sign with fewer secrets than the partner expects.
pub async fn signing(
    conn: &mut MySqlConnection,
    sealer: &Sealer,
    partner_id: u64,
    now: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Result<SigningSecrets, SealError>, sqlx::Error> {
    let rows: Vec<SealedRow> = sqlx::query_as(
        "SELECT key_id, nonce, ciphertext FROM partner_webhook_secrets \
         WHERE partner_id = ? AND (expires_at IS NULL OR expires_at > COALESCE(?, NOW(6))) \
         ORDER BY id DESC",
    )
    .bind(partner_id)
    .bind(now)
    .fetch_all(conn)
    .await?;
    let aad = aad(partner_id);
    Ok(rows
        .into_iter()
        .map(|row| sealer.open(&Sealed::from(row), &aad))
        .collect::<Result<Vec<_>, _>>()
        .map(SigningSecrets))
}

/// What [`seal_plaintext`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SealedPlaintext {
    /// Partners whose plaintext secret is now sealed (and the column NULL).
    pub sealed: u64,
}

/// Partners sealed per transaction by [`seal_plaintext`].
const SEAL_BATCH: u32 = 100;

/// The data fix-up after the migrations (run by `paybus migrate` and the migrate Lambda): every
/// partner's plaintext `webhook_secret` is sealed into `partner_webhook_secrets` (as its oldest
/// row, unexpired) and the column set to NULL, in batches, each row under its lock (so two
/// concurrent runs seal a partner once). Idempotent: a second run finds nothing. Without a
/// sealer, fails naming `PAYBUS_SECRETS_KEY` if any plaintext is left, else does nothing.
pub async fn seal_plaintext(
    conn: &mut MySqlConnection,
    sealer: Option<&Sealer>,
) -> Result<SealedPlaintext, SealPlaintextError> {
    let mut done = SealedPlaintext::default();
    loop {
        let mut tx = conn.begin().await?;
        let rows: Vec<(u64, String)> = sqlx::query_as(
            "SELECT id, webhook_secret FROM partners WHERE webhook_secret IS NOT NULL \
             ORDER BY id LIMIT ? FOR UPDATE",
        )
        .bind(SEAL_BATCH)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(done);
        }
        let Some(sealer) = sealer else {
            return Err(SealPlaintextError::NoKey);
        };
        for (partner_id, secret) in &rows {
            let secret = Zeroizing::new(secret.clone());
            insert(&mut tx, sealer, *partner_id, secret.as_bytes())
                .await
                .map_err(|e| match e {
                    WebhookSecretError::Database(e) => SealPlaintextError::Database(e),
                    WebhookSecretError::Seal(e) => SealPlaintextError::Seal(e),
                    WebhookSecretError::PartnerNotFound(_) => SealPlaintextError::NoKey,
                })?;
            // The earlier sealed rows of this partner (none, normally) stay newer than it.
            sqlx::query("UPDATE partners SET webhook_secret = NULL WHERE id = ?")
                .bind(partner_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        done.sealed += rows.len() as u64;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SealPlaintextError {
    #[error(
        "partners still hold plaintext webhook secrets and PAYBUS_SECRETS_KEY is not set: set \
         it (32 bytes as 64 hex digits or base64) and run the migration again, which seals them"
    )]
    NoKey,
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// What [`rotate_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resealed {
    /// Rows now sealed under the current key.
    pub resealed: u64,
    /// Rows another run re-sealed first (the conditional UPDATE found them moved).
    pub raced: u64,
}

#[derive(sqlx::FromRow)]
struct ResealRow {
    id: u64,
    partner_id: u64,
    #[sqlx(flatten)]
    sealed: SealedRow,
}

/// Rows re-sealed per read by [`rotate_key`].
const RESEAL_BATCH: u32 = 200;

/// Re-seals every row under a key other than the sealer's current one with the current key,
/// paging by id. Each UPDATE is conditional on the row's old key id, so a concurrent run (or
/// a second process) re-seals a row once; a row under a key the sealer does not hold fails
/// the run (naming that key id) rather than be skipped.
pub async fn rotate_key(
    conn: &mut MySqlConnection,
    sealer: &Sealer,
) -> Result<Resealed, WebhookSecretError> {
    let mut done = Resealed::default();
    let mut after = 0u64;
    loop {
        let rows: Vec<ResealRow> = sqlx::query_as(
            "SELECT id, partner_id, key_id, nonce, ciphertext FROM partner_webhook_secrets \
             WHERE key_id <> ? AND id > ? ORDER BY id LIMIT ?",
        )
        .bind(sealer.current_key_id())
        .bind(after)
        .bind(RESEAL_BATCH)
        .fetch_all(&mut *conn)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(done);
        };
        after = last.id;
        for ResealRow {
            id,
            partner_id,
            sealed,
        } in rows
        {
            let old = Sealed::from(sealed);
            let new = sealer.reseal(&old, &aad(partner_id))?;
            let moved = sqlx::query(
                "UPDATE partner_webhook_secrets SET key_id = ?, nonce = ?, ciphertext = ? \
                 WHERE id = ? AND key_id = ?",
            )
            .bind(&new.key_id)
            .bind(&new.nonce)
            .bind(&new.ciphertext)
            .bind(id)
            .bind(&old.key_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if moved == 1 {
                done.resealed += 1;
            } else {
                done.raced += 1;
            }
        }
    }
}

/// Rows under each key id (what `rotate-key` prints before and after).
pub async fn count_by_key(conn: &mut MySqlConnection) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT key_id, COUNT(*) FROM partner_webhook_secrets GROUP BY key_id ORDER BY key_id",
    )
    .fetch_all(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whsec_secret_is_decoded_and_a_legacy_one_is_its_bytes() {
        let (key, revealed) = generate().unwrap();
        assert_eq!(key.len(), SECRET_BYTES);
        assert!(revealed.expose().starts_with(PREFIX));
        assert_eq!(parse(revealed.expose()).unwrap(), key);
        assert_eq!(
            parse("partner-45-signing-secret").unwrap().as_slice(),
            b"partner-45-signing-secret"
        );
        assert!(parse("short").is_err());
        assert!(parse("whsec_!!not base64!!").is_err());
        assert!(parse("whsec_AAAA").is_err(), "3 bytes is too short a key");
        assert_eq!(format!("{revealed:?}"), "RevealedSecret(***)");
    }
}
