//! One configuration model for all CMS binaries.
//!
//! A binary declares its options once, as a struct that derives
//! `clap::Args` (each field a `--flag` with `default_value_t` and a doc comment
//! naming the unit) and serde's `Serialize` / `Deserialize` with
//! `#[serde(deny_unknown_fields)]`. [`load_config`] then layers, lowest to
//! highest precedence:
//!
//! 1. the defaults declared on the flags,
//! 2. the TOML file named by `--config` (an error if it does not exist),
//! 3. environment variables `<PREFIX><KEY>` (e.g. `CMS_BOOKIE_JOURNAL_DIR`),
//! 4. the flags actually typed on the command line.
//!
//! An unknown key in the file or the environment, a value of the wrong type, or
//! a missing file gives a [`ConfigError`] whose one-line message names the key
//! and its source; [`load_config_or_exit`] prints it and exits with code 2.
//!
//! ```
//! use clap::{Args, Command, FromArgMatches};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Args, Serialize, Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Demo {
//!     /// Session timeout, in milliseconds.
//!     #[arg(long, default_value_t = 4000)]
//!     session_timeout_ms: u64,
//! }
//!
//! let matches = Demo::augment_args(Command::new("demo"))
//!     .try_get_matches_from(["demo", "--session-timeout-ms", "9000"])
//!     .unwrap();
//! let cfg: Demo = cms_common::load_config(&matches, None, "CMS_DEMO_").unwrap();
//! assert_eq!(cfg.session_timeout_ms, 9000);
//! ```

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Exit code for configuration errors (bad flag, unknown key, bad value, missing
/// file), the same code clap uses for usage errors.
pub const CONFIG_ERROR_EXIT_CODE: i32 = 2;

/// Flags that say where configuration comes from and what to do with it; they
/// are not configuration keys themselves.
#[derive(Debug, Clone, Args)]
pub struct ConfigFileArgs {
    /// TOML configuration file; keys are the long flag names with `_` for `-`.
    /// Precedence: defaults < file < `CMS_*` environment < command-line flags.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// A configuration that could not be loaded. The message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `--config` named a file that does not exist or cannot be read.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// A key is unknown or has a bad value.
    #[error("config key `{key}` ({origin}): {reason}")]
    Key {
        /// Dotted key path, or `<root>`.
        key: String,
        /// Where the value came from: a file path, `environment`, `command line`,
        /// or `default`.
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// The effective configuration is inconsistent (checked after merging).
    #[error("config key `{key}`: {reason}")]
    Invalid {
        /// The offending key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// Loads `C` from the layers described in the module docs. `matches` are the
/// matches of the (sub)command that flattened `C`'s flags; `file` is the
/// `--config` value; `env_prefix` is e.g. `"CMS_BOOKIE_"`.
pub fn load_config<C>(
    matches: &ArgMatches,
    file: Option<&Path>,
    env_prefix: &str,
) -> Result<C, ConfigError>
where
    C: Args + FromArgMatches + Serialize + DeserializeOwned,
{
    // 1. Defaults: exactly what the flags declare, so --help and behaviour agree.
    let defaults_matches = C::augment_args(Command::new("defaults"))
        .try_get_matches_from(["defaults"])
        .map_err(|e| ConfigError::Invalid {
            key: "<defaults>".into(),
            reason: one_line(&e.to_string()),
        })?;
    let defaults = C::from_arg_matches(&defaults_matches).map_err(|e| ConfigError::Invalid {
        key: "<defaults>".into(),
        reason: one_line(&e.to_string()),
    })?;
    let mut figment = Figment::from(Serialized::defaults(&defaults));

    // 2. The file, which must exist when named.
    if let Some(path) = file {
        let meta = std::fs::metadata(path).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        if !meta.is_file() {
            return Err(ConfigError::File {
                path: path.display().to_string(),
                reason: "not a regular file".into(),
            });
        }
        figment = figment.merge(Toml::file_exact(path));
    }

    // 3. Environment. `<PREFIX>CONFIG` names the file (handled by the binary), not a key.
    figment = figment.merge(Env::prefixed(env_prefix).ignore(&["config"]));

    // 4. Flags typed on the command line, and only those.
    let parsed = C::from_arg_matches(matches).map_err(|e| ConfigError::Invalid {
        key: "<command line>".into(),
        reason: one_line(&e.to_string()),
    })?;
    let mut explicit = serde_json::Map::new();
    if let serde_json::Value::Object(all) =
        serde_json::to_value(&parsed).map_err(|e| ConfigError::Invalid {
            key: "<command line>".into(),
            reason: e.to_string(),
        })?
    {
        for (key, value) in all {
            // `value_source` panics on ids that are not arguments; check first.
            let typed = matches.ids().any(|id| id.as_str() == key)
                && matches.value_source(&key) == Some(ValueSource::CommandLine);
            if typed {
                explicit.insert(key, value);
            }
        }
    }
    figment = figment.merge(Serialized::globals(explicit));

    figment
        .extract::<C>()
        .map_err(|e| figment_error(e, env_prefix))
}

/// [`load_config`], printing the error and exiting with
/// [`CONFIG_ERROR_EXIT_CODE`] if it fails.
pub fn load_config_or_exit<C>(matches: &ArgMatches, file: Option<&Path>, env_prefix: &str) -> C
where
    C: Args + FromArgMatches + Serialize + DeserializeOwned,
{
    match load_config(matches, file, env_prefix) {
        Ok(c) => c,
        Err(e) => exit_config_error(&e),
    }
}

/// Prints a configuration error on one line and exits with code 2.
pub fn exit_config_error(e: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(CONFIG_ERROR_EXIT_CODE)
}

/// The effective configuration as TOML, for `--print-config`.
pub fn to_toml<C: Serialize>(config: &C) -> String {
    match toml::to_string_pretty(config) {
        Ok(s) => s,
        Err(e) => format!("# could not render configuration: {e}\n"),
    }
}

fn figment_error(e: figment::Error, env_prefix: &str) -> ConfigError {
    let key = if e.path.is_empty() {
        "<root>".to_string()
    } else {
        e.path.join(".")
    };
    let origin = match e.metadata.as_ref() {
        Some(meta) => match &meta.source {
            Some(figment::Source::File(p)) => p.display().to_string(),
            _ if meta.name.contains("environment") => {
                format!("environment {env_prefix}{}", key.to_uppercase())
            }
            _ if meta.name.contains("Serialized") || meta.name.contains("global") => {
                "command line".to_string()
            }
            _ => meta.name.to_string(),
        },
        None => "unknown source".to_string(),
    };
    // For unknown keys figment names the key in the kind; its path may or may not
    // end with it already (figment 0.10 includes it), so never name it twice.
    let (key, reason) = match &e.kind {
        figment::error::Kind::UnknownField(field, _) => {
            let full = if e.path.last() == Some(field) {
                key
            } else if e.path.is_empty() {
                field.clone()
            } else {
                format!("{key}.{field}")
            };
            (full, "unknown key".to_string())
        }
        kind => (key, one_line(&kind.to_string())),
    };
    ConfigError::Key {
        key,
        origin,
        reason,
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
#[allow(
    clippy::result_large_err,
    reason = "figment::Jail closures must return figment::Error, which is large"
)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde::Deserialize;
    use std::io::Write;

    #[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        /// A timeout, in milliseconds.
        #[arg(long, default_value_t = 4000)]
        timeout_ms: u64,
        /// A name.
        #[arg(long, default_value = "alpha")]
        name: String,
        /// A switch.
        #[arg(long, default_value_t = false)]
        verbose: bool,
    }

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        file: ConfigFileArgs,
        #[command(flatten)]
        sample: Sample,
    }

    fn matches(args: &[&str]) -> ArgMatches {
        use clap::CommandFactory;
        Cli::command().try_get_matches_from(args).unwrap()
    }

    fn file(contents: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        f.write_all(contents.as_bytes()).unwrap();
        f
    }

    // Environment variables are process-global: tests set them only inside
    // `figment::Jail`, which serialises them, and each uses its own prefix.

    #[test]
    fn defaults_come_from_the_flags() {
        let c: Sample = load_config(&matches(&["x"]), None, "CMS_T1_").unwrap();
        assert_eq!(
            c,
            Sample {
                timeout_ms: 4000,
                name: "alpha".into(),
                verbose: false
            }
        );
    }

    #[test]
    fn file_then_env_then_flags() {
        let f = file("timeout_ms = 10\nname = \"from-file\"\nverbose = true\n");
        let c: Sample = load_config(&matches(&["x"]), Some(f.path()), "CMS_T2_").unwrap();
        assert_eq!(
            (c.timeout_ms, c.name.as_str(), c.verbose),
            (10, "from-file", true)
        );

        figment::Jail::expect_with(|jail| {
            jail.set_env("CMS_T2_TIMEOUT_MS", "20");
            let c: Sample = load_config(&matches(&["x"]), Some(f.path()), "CMS_T2_").unwrap();
            assert_eq!((c.timeout_ms, c.name.as_str()), (20, "from-file"));
            let c: Sample = load_config(
                &matches(&["x", "--timeout-ms", "30"]),
                Some(f.path()),
                "CMS_T2_",
            )
            .unwrap();
            assert_eq!(c.timeout_ms, 30);
            Ok(())
        });

        let c: Sample = load_config(
            &matches(&["x", "--timeout-ms", "30", "--name", "flag"]),
            Some(f.path()),
            "CMS_T2_",
        )
        .unwrap();
        assert_eq!(
            (c.timeout_ms, c.name.as_str(), c.verbose),
            (30, "flag", true)
        );
    }

    #[test]
    fn a_flag_equal_to_its_default_still_wins() {
        let f = file("timeout_ms = 10\n");
        let c: Sample = load_config(
            &matches(&["x", "--timeout-ms", "4000"]),
            Some(f.path()),
            "CMS_T3_",
        )
        .unwrap();
        assert_eq!(c.timeout_ms, 4000);
    }

    #[test]
    fn unknown_key_in_file_names_key_and_file() {
        let f = file("timeout_ms = 10\nbogus_key = 1\n");
        let e = load_config::<Sample>(&matches(&["x"]), Some(f.path()), "CMS_T4_").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`bogus_key`"), "the key, once: {msg}");
        assert!(msg.contains(&f.path().display().to_string()), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn bad_value_names_key_and_file() {
        let f = file("timeout_ms = \"soon\"\n");
        let e = load_config::<Sample>(&matches(&["x"]), Some(f.path()), "CMS_T5_").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("timeout_ms"), "{msg}");
        assert!(msg.contains(&f.path().display().to_string()), "{msg}");
    }

    #[test]
    fn unknown_and_bad_env_keys_are_errors() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("CMS_T6_NOPE", "1");
            let e = load_config::<Sample>(&matches(&["x"]), None, "CMS_T6_").unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("`nope`"), "the key, once: {msg}");
            assert!(msg.contains("environment CMS_T6_NOPE"), "{msg}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("CMS_T6_TIMEOUT_MS", "-5");
            let e = load_config::<Sample>(&matches(&["x"]), None, "CMS_T6_").unwrap_err();
            assert!(e.to_string().contains("timeout_ms"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let e = load_config::<Sample>(
            &matches(&["x"]),
            Some(Path::new("/nonexistent/cms.toml")),
            "CMS_T7_",
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::File { .. }));
        assert!(e.to_string().contains("/nonexistent/cms.toml"));
    }

    #[test]
    fn malformed_toml_is_an_error_naming_the_file() {
        let f = file("timeout_ms = = 3\n");
        let e = load_config::<Sample>(&matches(&["x"]), Some(f.path()), "CMS_T8_").unwrap_err();
        assert!(
            e.to_string().contains(&f.path().display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn print_config_renders_toml() {
        let c: Sample = load_config(&matches(&["x"]), None, "CMS_T9_").unwrap();
        let s = to_toml(&c);
        assert!(s.contains("timeout_ms = 4000"), "{s}");
        let back: Sample = toml::from_str(&s).unwrap();
        assert_eq!(back, c);
    }
}
