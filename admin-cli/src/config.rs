//! Profiles: named connection settings in a TOML file (by default
//! `<config dir>/cms/admin.toml`, e.g. `~/.config/cms/admin.toml`; the
//! `CMS_ADMIN_CONFIG` environment variable or `--config` names another).
//!
//! ```toml
//! default = "prod"          # the profile used without --profile
//!
//! [profiles.prod]
//! url = "https://broker.example:8443"
//! token-file = "/etc/cms/admin.token"
//! tls-ca-file = "/etc/cms/ca.pem"
//! timeout = 20              # seconds
//! ```
//!
//! Precedence, per setting: the command-line flag, then its environment
//! variable, then the profile, then the built-in default.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::client::{AdminError, AdminResult};

/// One profile.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Profile {
    /// Base URL.
    pub url: Option<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// File holding the bearer token.
    pub token_file: Option<String>,
    /// Extra trusted CA (PEM).
    pub tls_ca_file: Option<String>,
    /// Request timeout in seconds.
    pub timeout: Option<u64>,
}

/// The config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The profile used when none is named.
    pub default: Option<String>,
    /// Profiles by name.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// The default config file path.
pub fn default_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("cms").join("admin.toml"))
}

/// Parses a config file's text.
pub fn parse(text: &str, origin: &str) -> AdminResult<ConfigFile> {
    toml::from_str(text).map_err(|e| AdminError::Local(format!("config file {origin}: {e}")))
}

/// The profile to use: `name` (an error if missing), else the file's
/// `default`, else none. `path` is read only if it exists, unless it was
/// named explicitly.
pub fn load(path: Option<PathBuf>, explicit: bool, name: Option<&str>) -> AdminResult<Profile> {
    let Some(path) = path else {
        return match name {
            Some(n) => Err(AdminError::Usage(format!(
                "profile {n:?} asked for but there is no config directory"
            ))),
            None => Ok(Profile::default()),
        };
    };
    let origin = path.display().to_string();
    let file = match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text, &origin)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => ConfigFile::default(),
        Err(e) => return Err(AdminError::Local(format!("config file {origin}: {e}"))),
    };
    pick(&file, name, &origin)
}

/// The named or default profile of `file`.
pub fn pick(file: &ConfigFile, name: Option<&str>, origin: &str) -> AdminResult<Profile> {
    let chosen = name.map(str::to_string).or_else(|| file.default.clone());
    match chosen {
        None => Ok(Profile::default()),
        Some(n) => file.profiles.get(&n).cloned().ok_or_else(|| {
            AdminError::Usage(format!(
                "no profile {n:?} in {origin} (profiles: {})",
                file.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_pick() {
        let f = parse(
            r#"
default = "a"
[profiles.a]
url = "http://a:8080"
timeout = 3
[profiles.b]
url = "https://b"
token-file = "/t"
tls-ca-file = "/ca.pem"
"#,
            "test",
        )
        .unwrap();
        assert_eq!(
            pick(&f, None, "t").unwrap().url.as_deref(),
            Some("http://a:8080")
        );
        let b = pick(&f, Some("b"), "t").unwrap();
        assert_eq!(b.token_file.as_deref(), Some("/t"));
        assert_eq!(b.tls_ca_file.as_deref(), Some("/ca.pem"));
        assert!(matches!(
            pick(&f, Some("c"), "t"),
            Err(AdminError::Usage(_))
        ));
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(parse("[profiles.a]\nurll = \"x\"\n", "t").is_err());
    }

    #[test]
    fn a_missing_default_file_is_no_profile() {
        let p = load(
            Some(PathBuf::from("/nonexistent/cms/admin.toml")),
            false,
            None,
        )
        .unwrap();
        assert_eq!(p, Profile::default());
        assert!(load(Some(PathBuf::from("/nonexistent/x.toml")), true, None).is_err());
    }
}
