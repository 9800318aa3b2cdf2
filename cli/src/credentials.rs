//! The token store `paybus login` writes: `$XDG_CONFIG_HOME/paybus/credentials.json` (default
//! `~/.config/paybus/`), the folder 0700 and the file 0600.
//!
//! The file is never readable by anyone else, not even for an instant: it is written to a new
//! file opened with mode 0600 in the 0700 folder and renamed over the old one, so neither a
//! `chmod` after the fact nor a half-written file is ever seen. Its tokens never reach a log,
//! an error or `Debug` output.

use std::{
    fs::{self, DirBuilder, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::Context;
use chrono::{DateTime, Utc};
use paybus_config::{Vars, setting::Setting};
use serde::{Deserialize, Serialize};

pub const VAR_CONFIG_HOME: Setting = Setting {
    name: "XDG_CONFIG_HOME",
    default: "`.config` in the home folder",
    about: "where `paybus login` keeps its tokens: `paybus/credentials.json` in it (the folder \
            0700, the file 0600); a relative path is ignored, as the XDG specification says",
};

const FOLDER: &str = "paybus";
const FILE: &str = "credentials.json";

/// A person's sign-in: what `paybus login` obtained from the provider for one API.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// The admin API the tokens are for (they are sent nowhere else).
    pub api: String,
    pub issuer: String,
    pub client_id: String,
    /// The resource indicator (RFC 8707) the provider issues the API's access tokens for;
    /// a refresh asks for it again.
    pub audience: String,
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub expires_at: DateTime<Utc>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("api", &self.api)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("audience", &self.audience)
            .field("access_token", &"***")
            .field("refresh_token", &self.refresh_token.as_ref().map(|_| "***"))
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// Where the credentials live.
#[derive(Debug, Clone)]
pub struct Store {
    folder: PathBuf,
}

impl Store {
    /// `$XDG_CONFIG_HOME/paybus`, or `~/.config/paybus`.
    pub fn locate(vars: &Vars) -> anyhow::Result<Self> {
        let config_home = vars
            .get(VAR_CONFIG_HOME)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute());
        let config_home = match config_home {
            Some(path) => path,
            None => std::env::home_dir()
                .filter(|home| home.is_absolute())
                .context(
                    "neither XDG_CONFIG_HOME nor a home folder is known: nowhere to keep the \
                     sign-in",
                )?
                .join(".config"),
        };
        Ok(Self::in_folder(config_home.join(FOLDER)))
    }

    /// The store in `folder` itself.
    pub fn in_folder(folder: PathBuf) -> Self {
        Self { folder }
    }

    pub fn path(&self) -> PathBuf {
        self.folder.join(FILE)
    }

    /// The stored sign-in, if there is one.
    pub fn load(&self) -> anyhow::Result<Option<Credentials>> {
        let path = self.path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("while reading {}", path.display()));
            }
        };
        // serde_json's error names a position, never the text, so no token is echoed.
        let credentials = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a paybus sign-in: run `paybus login` again",
                path.display()
            )
        })?;
        Ok(Some(credentials))
    }

    /// Replaces the stored sign-in: a new 0600 file in the 0700 folder, renamed into place.
    pub fn save(&self, credentials: &Credentials) -> anyhow::Result<()> {
        self.private_folder()?;
        let path = self.path();
        let staged = self
            .folder
            .join(format!(".{FILE}.{}", uuid::Uuid::new_v4().simple()));
        let written = write_private(&staged, &serde_json::to_vec_pretty(credentials)?)
            .and_then(|()| fs::rename(&staged, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&staged);
            return Err(e).with_context(|| format!("while writing {}", path.display()));
        }
        Ok(())
    }

    /// Deletes the stored sign-in; false when there was none.
    pub fn delete(&self) -> anyhow::Result<bool> {
        let path = self.path();
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).with_context(|| format!("while deleting {}", path.display())),
        }
    }

    /// The folder, made 0700 (with its missing parents) or narrowed to 0700 if it was wider.
    fn private_folder(&self) -> anyhow::Result<()> {
        let folder = &self.folder;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)
            .with_context(|| format!("while creating {}", folder.display()))?;
        let permissions = fs::metadata(folder)
            .with_context(|| format!("while reading {}", folder.display()))?
            .permissions();
        if permissions.mode() & 0o077 != 0 {
            fs::set_permissions(folder, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("while making {} private", folder.display()))?;
        }
        Ok(())
    }
}

/// Writes `bytes` to a new file created with mode 0600 (the mode is applied as it is created,
/// never after).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;

    use super::*;

    /// A folder of its own under the system's temporary folder, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            let path = std::env::temp_dir().join(format!(
                "paybus-credentials-{}",
                uuid::Uuid::new_v4().simple()
            ));
            fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn credentials(access_token: &str) -> Credentials {
        Credentials {
            api: "http://127.0.0.1:8080".to_owned(),
            issuer: "http://127.0.0.1:9090".to_owned(),
            client_id: "paybus-cli".to_owned(),
            audience: "urn:paybus:admin-api".to_owned(),
            access_token: access_token.to_owned(),
            refresh_token: Some("refresh-token-value".to_owned()),
            expires_at: DateTime::from_timestamp(1_796_601_600, 0).unwrap(),
        }
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_file_is_created_0600_in_a_0700_folder_under_xdg_config_home() {
        let scratch = Scratch::new();
        let config_home = scratch.0.join("config");
        let vars = Vars::new(HashMap::from([(
            VAR_CONFIG_HOME.name.to_owned(),
            config_home.display().to_string(),
        )]));
        let store = Store::locate(&vars).unwrap();

        store.save(&credentials("first-access-token")).unwrap();

        assert_eq!(store.path(), config_home.join("paybus/credentials.json"));
        assert_eq!(mode(&config_home.join("paybus")), 0o700);
        assert_eq!(mode(&store.path()), 0o600);
        assert_eq!(
            store.load().unwrap(),
            Some(credentials("first-access-token"))
        );
        // Nothing but the file is left beside it.
        let names: Vec<_> = fs::read_dir(config_home.join("paybus"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["credentials.json"]);
    }

    #[test]
    fn a_wider_file_or_folder_is_replaced_by_private_ones() {
        let scratch = Scratch::new();
        let folder = scratch.0.join("paybus");
        fs::create_dir(&folder).unwrap();
        fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(folder.join("credentials.json"), "{}").unwrap();
        fs::set_permissions(
            folder.join("credentials.json"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let store = Store::in_folder(folder.clone());

        store.save(&credentials("second-access-token")).unwrap();

        assert_eq!(mode(&folder), 0o700);
        assert_eq!(mode(&store.path()), 0o600);
        assert_eq!(
            store.load().unwrap().unwrap().access_token,
            "second-access-token"
        );
    }

    #[test]
    fn a_relative_xdg_config_home_is_ignored_and_delete_says_whether_there_was_a_file() {
        let vars = Vars::new(HashMap::from([(
            VAR_CONFIG_HOME.name.to_owned(),
            "relative/config".to_owned(),
        )]));
        if let Ok(store) = Store::locate(&vars) {
            assert!(store.path().is_absolute(), "{}", store.path().display());
        }
        let scratch = Scratch::new();
        let store = Store::in_folder(scratch.0.join("paybus"));
        assert!(store.load().unwrap().is_none());
        assert!(!store.delete().unwrap());
        store.save(&credentials("token")).unwrap();
        assert!(store.delete().unwrap());
        assert!(store.load().unwrap().is_none());
    }

    #[test]
    fn debug_output_hides_the_tokens() {
        let shown = format!("{:?}", credentials("secret-access-token"));
        assert!(!shown.contains("secret-access-token"), "{shown}");
        assert!(!shown.contains("refresh-token-value"), "{shown}");
    }
}
