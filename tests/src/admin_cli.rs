//! Running the `cms-admin` binary in system tests (`tests/admin_cli*.rs`):
//! bounded runs with a clean environment (no inherited `CMS_ADMIN_*`, no
//! user config), and assertions on exit codes, stderr and tables.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::harness::bins;

/// Bound on one run of the binary, in milliseconds.
const RUN_TIMEOUT_MS: u64 = 60_000;

/// `cms-admin` exit code: refused by the server (400/403) or a local error.
pub const EXIT_REFUSED: i32 = 1;
/// `cms-admin` exit code: usage.
pub const EXIT_USAGE: i32 = 2;
/// `cms-admin` exit code: not found (404).
pub const EXIT_NOT_FOUND: i32 = 3;
/// `cms-admin` exit code: conflict (409/412).
pub const EXIT_CONFLICT: i32 = 4;
/// `cms-admin` exit code: server error (5xx).
pub const EXIT_SERVER: i32 = 5;
/// `cms-admin` exit code: unreachable or timed out.
pub const EXIT_UNREACHABLE: i32 = 6;

/// One finished run.
pub struct Run {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Run {
    /// Exit code, stdout and stderr, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Asserts success; the stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{}", self.describe());
        &self.stdout
    }

    /// Asserts success; stdout as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.ok())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.describe()))
    }

    /// Asserts exit `code` with `needle` in stderr.
    pub fn fails(&self, code: i32, needle: &str) {
        assert_eq!(self.code, Some(code), "{}", self.describe());
        assert!(
            self.stderr.contains(needle),
            "stderr lacks {needle:?}: {}",
            self.describe()
        );
    }

    /// The table's rows, split on whitespace (header included).
    pub fn rows(&self) -> Vec<Vec<String>> {
        self.ok()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    }
}

/// Runs `cms-admin args...` with `env`, stdin closed, no inherited
/// `CMS_ADMIN_*` variables and a config dir of its own.
pub async fn cms_admin_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let binary = bins::find("cms-admin").unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = tokio::process::Command::new(&binary);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("NO_COLOR", "1")
        // No user config leaks in: an empty config dir.
        .env("XDG_CONFIG_HOME", "/nonexistent-cms-admin-test")
        .kill_on_drop(true);
    for (key, _) in std::env::vars() {
        if key.starts_with("CMS_ADMIN_") {
            cmd.env_remove(key);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_millis(RUN_TIMEOUT_MS), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("cms-admin {args:?} did not exit within {RUN_TIMEOUT_MS} ms"))
        .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `cms-admin --url <url> args...`.
pub async fn admin(url: &str, args: &[&str]) -> Run {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    cms_admin_env(&all, &[]).await
}

/// The first column of a table, header left out.
pub fn first_column(run: &Run) -> Vec<String> {
    run.rows()
        .into_iter()
        .skip(1)
        .filter_map(|r| r.into_iter().next())
        .collect()
}
