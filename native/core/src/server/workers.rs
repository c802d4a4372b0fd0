//! The worker pool for request work that takes long: parsing, templating and tokenizing a large body.
//! It runs on tokio's blocking threads, at most `size` at once (a semaphore), so the runtime's I/O
//! threads stay free to move every other stream's messages and answer HTTP/2 pings.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Semaphore;

/// At most `size` jobs run at once; the rest wait their turn.
#[derive(Clone)]
pub struct Workers {
    permits: Arc<Semaphore>,
}

/// `requested` workers, or one per CPU when it is 0.
pub fn pool_size(requested: usize) -> usize {
    match requested {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

impl Workers {
    pub fn new(size: usize) -> Self {
        Workers {
            permits: Arc::new(Semaphore::new(size.max(1))),
        }
    }

    /// Run `job` on the pool once a worker is free; `None` if it panicked. The job runs to its end
    /// even when the future is dropped, its worker held until then.
    pub fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Option<T>> + Send>> {
        let permits = self.permits.clone();
        Box::pin(async move {
            let permit = permits.acquire_owned().await.ok()?;
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                job()
            })
            .await
            .ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn zero_means_one_worker_per_cpu() {
        assert!(pool_size(0) >= 1);
        assert_eq!(pool_size(3), 3);
    }

    #[test]
    fn no_more_jobs_run_at_once_than_the_pool_has_workers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let workers = Workers::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..6)
            .map(|i| {
                let (running, most) = (running.clone(), most.clone());
                workers.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    running.fetch_sub(1, Ordering::SeqCst);
                    i
                })
            })
            .collect();
        let done: Vec<_> = rt.block_on(async {
            let started: Vec<_> = jobs.into_iter().map(tokio::spawn).collect();
            let mut out = Vec::new();
            for job in started {
                out.push(job.await.unwrap());
            }
            out
        });
        assert_eq!(done, (0..6).map(Some).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_busy_pool_leaves_the_runtime_thread_free() {
        // One runtime thread: a timer on it still fires while a job blocks a worker for long.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let workers = Workers::new(1);
        let (ticked, job) = rt.block_on(async {
            let job = tokio::spawn(workers.run(|| std::thread::sleep(Duration::from_millis(500))));
            let began = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            (began.elapsed(), job)
        });
        assert!(
            ticked < Duration::from_millis(300),
            "the runtime thread waited {ticked:?}"
        );
        assert_eq!(rt.block_on(job).unwrap(), Some(()));
    }

    #[test]
    fn a_panicking_job_gives_none() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let workers = Workers::new(1);
        assert_eq!(rt.block_on(workers.run(|| -> u8 { panic!("job failed") })), None);
        // The worker is free again.
        assert_eq!(rt.block_on(workers.run(|| 7)), Some(7));
    }
}
