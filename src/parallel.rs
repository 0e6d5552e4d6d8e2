//! Work spread over every core, the async runtime that runs calls, and locks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// A mutex's guard whether or not a thread panicked holding it: what gacc keeps behind a lock
/// is updated in single steps, so a lock a panic poisoned still holds a consistent value, and a
/// run goes on (its panicking task is reported where it is joined).
pub(crate) trait Locked<T> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The multi-threaded runtime that runs a command's calls, its worker threads bounded when
/// `workers` says so.
pub(crate) fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder.enable_all().build()
}

/// Resolves when the process is sent SIGTERM (never, where that cannot be listened for).
pub(crate) async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// `work` run as a task on the runtime until it ends, or None at Ctrl-C or SIGTERM (a
/// scheduler's preemption): then it is aborted and awaited, so whatever it holds is dropped
/// (a run's row files flushed) before the caller says it was interrupted. As a task, `work` is
/// woken on a worker, not on the thread that blocks on the runtime, which each waking would
/// take a futex and a context switch (64k at paper scale). A panic in it is passed on.
pub(crate) async fn until_interrupted<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let mut running = tokio::spawn(work);
    let ended = tokio::select! {
        ended = &mut running => Some(ended),
        _ = tokio::signal::ctrl_c() => None,
        _ = terminated() => None,
    };
    if ended.is_none() {
        running.abort();
        _ = (&mut running).await;
    }
    ended.and_then(joined)
}

/// What a task gave, or None when it was cancelled; a panic in it is passed on, as it would
/// be had its work been awaited inline.
pub(crate) fn joined<T>(ended: Result<T, tokio::task::JoinError>) -> Option<T> {
    match ended.map_err(tokio::task::JoinError::try_into_panic) {
        Ok(done) => Some(done),
        Err(Ok(panic)) => std::panic::resume_unwind(panic),
        Err(Err(_)) => None,
    }
}

/// `f` of every item, on every core, in the items' order. A panic in `f` is passed on.
pub(crate) fn map_in_parallel<I: Sync, T: Send>(items: &[I], f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut done: Vec<(usize, T)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(items.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
mod tests {
    /// Work that ends gives its output; work that panics panics in the caller, as it would
    /// inline, not as an interruption.
    #[test]
    fn work_until_interrupted_gives_its_output_and_passes_its_panic_on() {
        let runtime = super::runtime(Some(1)).unwrap();
        assert_eq!(runtime.block_on(super::until_interrupted(async { 7 })), Some(7));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(super::until_interrupted(async { panic!("the loop broke") }))
        }));
        let message = panicked.unwrap_err();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"the loop broke"));
    }

    #[test]
    fn results_keep_the_items_order() {
        let items: Vec<u64> = (0..1000).collect();
        assert_eq!(
            super::map_in_parallel(&items, |i| i * 2),
            (0..1000).map(|i| i * 2).collect::<Vec<_>>()
        );
        assert!(super::map_in_parallel(&[] as &[u8], |b| *b).is_empty());
    }
}
