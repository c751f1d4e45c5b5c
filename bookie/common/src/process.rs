//! What every binary's `main` does around its async work: run it on a
//! tokio runtime and turn the outcome into an exit code ([`run_main`]), and
//! wait for SIGTERM or SIGINT ([`shutdown_signal`]).
//!
//! One runtime thread asked for (`worker_threads = 1`) is tokio's
//! current-thread runtime: the main thread runs every task, as the one
//! worker of a multi-threaded runtime would, without the work-stealing
//! scheduler's bookkeeping (about 3 % fewer instructions per W2 message in
//! the broker and 2 % in a bookie, BENCHMARKS.md "Instructions per
//! message"). Blocking work still goes to `spawn_blocking`'s pool.

use std::process::ExitCode;

/// Runs `fut` to completion on a new multi-threaded runtime: exit 0 on
/// `Ok`, exit 1 with `error: <chain>` on stderr on `Err` or if the runtime
/// cannot start.
pub fn run_main(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    run_main_with(0, fut)
}

/// [`run_main`] on `worker_threads` runtime threads (0 = tokio's default:
/// `TOKIO_WORKER_THREADS`, else one per CPU the process may use; 1 = the
/// current-thread runtime on the calling thread). Servers that share a few
/// cores with other processes switch less with fewer workers
/// (BENCHMARKS.md, "Worker threads").
pub fn run_main_with(
    worker_threads: usize,
    fut: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let mut builder = if worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if worker_threads > 0 {
            b.worker_threads(worker_threads);
        }
        b
    };
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

    #[test]
    fn one_thread_is_the_current_thread_runtime_and_still_runs_blocking_work() {
        use tokio::runtime::RuntimeFlavor;
        let flavor = |n: usize| {
            let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
            let s = seen.clone();
            let code = run_main_with(n, async move {
                let main = std::thread::current().id();
                // A spawned task runs on the calling thread; spawn_blocking
                // on another one, without stalling the runtime.
                let task = tokio::spawn(async { std::thread::current().id() })
                    .await
                    .map_err(anyhow::Error::from)?;
                let blocking = tokio::task::spawn_blocking(|| std::thread::current().id())
                    .await
                    .map_err(anyhow::Error::from)?;
                *s.lock().unwrap() = Some((
                    tokio::runtime::Handle::current().runtime_flavor(),
                    task == main,
                    blocking != main,
                ));
                Ok(())
            });
            assert_eq!(code, ExitCode::SUCCESS);
            seen.lock().unwrap().take().expect("ran")
        };
        assert_eq!(flavor(1), (RuntimeFlavor::CurrentThread, true, true));
        let (f, task_on_main, _) = flavor(2);
        assert_eq!(f, RuntimeFlavor::MultiThread);
        assert!(
            !task_on_main,
            "a multi-threaded runtime's tasks run on its workers"
        );
    }
}
