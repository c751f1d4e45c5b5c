//! Running `cms-perf` (our load generator) from system tests: one bounded
//! run, its output checked and its `--json` object parsed.

use std::time::Duration;

/// Runs `cms-perf ARGS`, killed if still running after `within`; panics
/// (the test fails) when it does not finish in time.
pub async fn run(args: &[&str], within: Duration) -> std::process::Output {
    let perf = super::bins::find("cms-perf").expect("the cms-perf binary is built");
    let mut cmd = tokio::process::Command::new(&perf);
    cmd.args(args).kill_on_drop(true);
    tokio::time::timeout(within, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("cms-perf {args:?} did not finish in {within:?}"))
        .expect("cms-perf started")
}

/// Runs `cms-perf ARGS --json` (see [`run`]), asserts that it succeeded and
/// returns the JSON object it printed.
pub async fn json(args: &[&str], within: Duration) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = run(&all, within).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cms-perf {args:?}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("cms-perf {args:?} printed no JSON object ({e}): {stdout}"))
}
