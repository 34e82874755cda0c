//! A fixed crew of scoped threads that runs one job together, again and again: the timed
//! operation of a multi-threaded case. Scoped, so the memory a job writes outlives the threads
//! by construction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::{Scope, ScopedJoinHandle};

struct Shared {
    /// Every worker and the caller meet here before a run...
    start: Barrier,
    /// ...and here after it.
    end: Barrier,
    /// Read by the workers after `start`: leave instead of running the job.
    stop: AtomicBool,
}

/// `threads` workers, each running `job(index, threads)` once per [`Crew::run`].
///
/// A run costs the job plus waking the parked workers (tens of microseconds in a VM): time
/// jobs of milliseconds with it. A job must not panic (the others would wait forever).
pub(super) struct Crew<'scope> {
    shared: Arc<Shared>,
    workers: Vec<ScopedJoinHandle<'scope, ()>>,
}

impl<'scope> Crew<'scope> {
    /// Starts the workers in `scope`; they wait for the first [`run`](Self::run).
    pub(super) fn spawn<'env, F>(
        scope: &'scope Scope<'scope, 'env>,
        threads: usize,
        job: F,
    ) -> Crew<'scope>
    where
        F: Fn(usize, usize) + Send + Sync + 'scope,
    {
        let shared = Arc::new(Shared {
            start: Barrier::new(threads + 1),
            end: Barrier::new(threads + 1),
            stop: AtomicBool::new(false),
        });
        let job = Arc::new(job);
        let workers = (0..threads)
            .map(|i| {
                let (shared, job) = (Arc::clone(&shared), Arc::clone(&job));
                scope.spawn(move || loop {
                    shared.start.wait();
                    // Relaxed suffices: the barrier orders the store before this load.
                    if shared.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    job(i, threads);
                    shared.end.wait();
                })
            })
            .collect();
        Crew { shared, workers }
    }

    /// Runs the job on every worker and returns when all have finished it.
    pub(super) fn run(&self) {
        self.shared.start.wait();
        self.shared.end.wait();
    }
}

impl Drop for Crew<'_> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.start.wait();
        for w in self.workers.drain(..) {
            // A worker that panicked has already reported it; nothing to add here.
            let _ = w.join();
        }
    }
}
