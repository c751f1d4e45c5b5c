//! Shared start-up code for every CMS binary: configuration and logging.
//!
//! This was a module of `cms-bookie`; it is its own crate (under `bookie/`, as
//! DESIGN §1 allows) so that the broker, `cms-perf` and the tests load their
//! configuration the same way without depending on the bookie.
//!
//! - [`config`]: one configuration model for all binaries. Each option is
//!   declared once, as a clap flag with its default and unit; the effective value
//!   comes from, lowest to highest precedence, that default, a TOML file
//!   (`--config`), `CMS_<BINARY>_<KEY>` environment variables, and flags given on
//!   the command line. Unknown keys and bad values are one-line errors naming the
//!   key and where it came from; binaries exit with code 2 on them.
//! - [`logging`]: `tracing` with an env filter and `--log-format text|json`.
//! - [`process`]: the runtime around `main` and the shutdown signal.

pub mod config;
pub mod logging;
pub mod process;

pub use config::{ConfigError, ConfigFileArgs, load_config, load_config_or_exit};
pub use logging::{LogArgs, LogFormat, init_logging};
pub use process::{run_main, run_main_with, shutdown_signal};
