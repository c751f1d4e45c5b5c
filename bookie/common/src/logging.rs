//! Logging set-up: `tracing-subscriber` with an env filter and a text or JSON
//! format, written to stderr. Spans carry the fields of STYLE §5 (tenant,
//! namespace, topic, ledger, bookie); this module only decides how they print.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// How log lines are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with span fields, for log collectors.
    Json,
}

/// Logging flags every binary takes.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Log filter (tracing env-filter syntax, e.g. `info,cms_bookie=debug`);
    /// `RUST_LOG`, when set, takes precedence.
    #[arg(long, default_value = "info", global = true)]
    pub log_level: String,
}

/// Installs the global subscriber. Returns an error if the filter does not parse.
/// Calling it twice is harmless (the second call keeps the first subscriber).
pub fn init_logging(args: &LogArgs) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG={v:?}: {e}"))?
        }
        _ => EnvFilter::try_new(&args.log_level)
            .map_err(|e| format!("--log-level {:?}: {e}", args.log_level))?,
    };
    // Colours only on a terminal: log files and CI output stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
    // An already-installed subscriber (tests, embedded use) is not an error.
    let _ = result;
    Ok(())
}
