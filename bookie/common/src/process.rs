//! What every binary's `main` does around its async work: run it on a
//! multi-threaded tokio runtime and turn the outcome into an exit code
//! ([`run_main`]), and wait for SIGTERM or SIGINT ([`shutdown_signal`]).

use std::process::ExitCode;

/// Runs `fut` to completion on a new multi-threaded runtime: exit 0 on
/// `Ok`, exit 1 with `error: <chain>` on stderr on `Err` or if the runtime
/// cannot start.
pub fn run_main(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Resolves at the first SIGTERM or SIGINT (never, if SIGTERM cannot be
/// listened for: that is logged, and the process is then stopped by SIGKILL).
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
