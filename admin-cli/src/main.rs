//! `cms-admin`, the operator CLI over the admin REST API (`/admin/v2`,
//! `docs/admin-api.md`): pulsar-admin's nouns and verbs (`tenants create
//! NAME`, `namespaces create TENANT/NS`, `topics create persistent://...`,
//! `queues create TENANT/NS/QUEUE`, ...), table / JSON / YAML output.
//!
//! It speaks only REST (cluster initialisation stays in `cms-broker
//! init-cluster`, DESIGN §1). Promises: every failure prints the server's
//! reason on stderr and exits with a documented code (see
//! [`client`]: 1 refused, 2 usage, 3 not found, 4 conflict, 5 server error,
//! 6 unreachable); no request outlives `--timeout`; destructive commands
//! ask on a terminal and refuse without `--yes` otherwise.

mod cli;
mod client;
mod commands;
mod config;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command, Global};
use crate::client::{Admin, AdminError, AdminResult, Settings};

/// The URL used when no flag, environment variable or profile gives one.
const DEFAULT_URL: &str = "http://localhost:8080";
/// The request timeout when no flag or profile gives one, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 30;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                client::EXIT_USAGE
            } else {
                client::EXIT_OK
            });
        }
    };
    if let Command::Completions { shell } = cli.command {
        let mut cmd = Cli::command();
        clap_complete::generate(shell, &mut cmd, "cms-admin", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let format = cli.global.output;
    let result = settings(&cli.global).and_then(|s| {
        let ctx = commands::Ctx {
            admin: Admin::new(&s)?,
            yes: cli.global.yes,
        };
        commands::run(&ctx, cli.command)
    });
    match result {
        Ok(shown) => {
            let text = output::render(&shown, format);
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cms-admin: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Flags, then environment (clap), then the profile, then defaults.
fn settings(g: &Global) -> AdminResult<Settings> {
    let (path, explicit) = match &g.config {
        Some(p) => (Some(PathBuf::from(p)), true),
        None => (config::default_path(), false),
    };
    let profile = config::load(path, explicit, g.profile.as_deref())?;
    let url = g
        .url
        .clone()
        .or(profile.url)
        .unwrap_or_else(|| DEFAULT_URL.to_string());
    let token = match (&g.token, &g.token_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(read_token(f)?),
        (None, None) => match (profile.token, profile.token_file) {
            (Some(t), _) => Some(t),
            (None, Some(f)) => Some(read_token(&f)?),
            (None, None) => None,
        },
    };
    Ok(Settings {
        url,
        token,
        tls_ca_file: g.tls_ca_file.clone().or(profile.tls_ca_file),
        timeout: Duration::from_secs(
            g.timeout
                .or(profile.timeout)
                .unwrap_or(DEFAULT_TIMEOUT_SECS),
        ),
    })
}

fn read_token(path: &str) -> AdminResult<String> {
    let t = std::fs::read_to_string(path)
        .map_err(|e| AdminError::Local(format!("reading token file {path}: {e}")))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err(AdminError::Local(format!("token file {path} is empty")));
    }
    Ok(t)
}
