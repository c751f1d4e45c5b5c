//! What every binary's `main` does around its async work: run it on a
//! multi-threaded tokio runtime and turn the outcome into an exit code
//! ([`run_main`]), and wait for SIGTERM or SIGINT ([`shutdown_signal`]).

use std::process::ExitCode;

/// Runs `fut` to completion on a new multi-threaded runtime: exit 0 on
/// `Ok`, exit 1 with `error: <chain>` on stderr on `Err` or if the runtime
/// cannot start.
pub fn run_main(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    run_main_with(0, fut)
}

/// [`run_main`] on `worker_threads` runtime threads (0 = tokio's default:
/// `TOKIO_WORKER_THREADS`, else one per CPU the process may use). Servers
/// that share a few cores with other processes switch less with fewer
/// workers (BENCHMARKS.md, "Worker threads").
pub fn run_main_with(
    worker_threads: usize,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    let runtime = match builder.enable_all().build() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_has_the_threads_asked_for() {
        let workers = |n: usize| {
            let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let s = seen.clone();
            let code = run_main_with(n, async move {
                s.store(
                    tokio::runtime::Handle::current().metrics().num_workers(),
                    std::sync::atomic::Ordering::SeqCst,
                );
                Ok(())
            });
            assert_eq!(code, ExitCode::SUCCESS);
            seen.load(std::sync::atomic::Ordering::SeqCst)
        };
        assert_eq!(workers(1), 1);
        assert_eq!(workers(3), 3);
        assert!(workers(0) >= 1);
    }
}
