//! The inter-token deadline of module-path streams (the ext_proc path's is `extproc_core::stream`'s
//! `deadline.rs`, run by extproc's server): a stream whose engine went silent for its deadline is woken on
//! its worker thread (Envoy's filter scheduler) to end the answer.
//!
//! Envoy gives a filter no timer of its own, so one thread for the whole module watches every stream
//! with a deadline. A token costs the stream one clock read and one atomic store (`Watch::progress`);
//! the thread looks at the watches at least every `TICK`, and sooner when a deadline falls sooner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::abi;

/// The longest the thread sleeps between looks.
const TICK: Duration = Duration::from_millis(50);

/// The event id the scheduler delivers to `HttpFilter::scheduled` when a deadline passed.
pub const DEADLINE_EVENT: u64 = 1;

/// Envoy's scheduler of one filter, deleted once (by the watch's owner).
struct Scheduler(abi::SchedulerPtr);

// SAFETY: Envoy's filter scheduler may be committed from any thread (that is its purpose); deletion and
// commits are serialised by the watch's mutex.
unsafe impl Send for Scheduler {}

struct Shared {
    scheduler: Mutex<Option<Scheduler>>,
    /// Milliseconds since `epoch()` of the engine's last message.
    last_ms: AtomicU64,
    budget_ms: u64,
    /// The wake-up was sent and not answered yet.
    fired: AtomicBool,
}

/// One stream's deadline, owned by its filter; dropping it stops the watch (before the filter goes).
pub struct Watch {
    shared: Arc<Shared>,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

fn watches() -> &'static Mutex<Vec<Weak<Shared>>> {
    static WATCHES: OnceLock<Mutex<Vec<Weak<Shared>>>> = OnceLock::new();
    WATCHES.get_or_init(|| {
        std::thread::Builder::new()
            .name("extproc-deadlines".into())
            .spawn(watch_loop)
            .expect("the deadline thread starts");
        Mutex::new(Vec::new())
    })
}

fn watch_loop() {
    loop {
        let now = now_ms();
        let mut next = now + TICK.as_millis() as u64;
        {
            let mut list = watches().lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|weak| {
                let Some(watch) = weak.upgrade() else { return false };
                let due = watch.last_ms.load(Ordering::Relaxed) + watch.budget_ms;
                if due <= now {
                    if !watch.fired.swap(true, Ordering::AcqRel) {
                        let scheduler = watch.scheduler.lock().unwrap_or_else(|p| p.into_inner());
                        if let Some(s) = scheduler.as_ref() {
                            // SAFETY: the scheduler is alive while held under the lock (Drop deletes it
                            // under the same lock).
                            unsafe {
                                abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(s.0, DEADLINE_EVENT)
                            };
                        }
                    }
                } else {
                    next = next.min(due);
                }
                true
            });
        }
        std::thread::sleep(Duration::from_millis(next.saturating_sub(now_ms()).max(1)));
    }
}

impl Watch {
    /// Watch a stream whose engine just sent something for `budget` of silence, waking it through its
    /// filter's `scheduler` (`Stream::new_scheduler`, owned from now on).
    pub fn start(scheduler: abi::SchedulerPtr, budget: Duration) -> Watch {
        let shared = Arc::new(Shared {
            scheduler: Mutex::new(Some(Scheduler(scheduler))),
            last_ms: AtomicU64::new(now_ms()),
            budget_ms: budget.as_millis().max(1) as u64,
            fired: AtomicBool::new(false),
        });
        watches()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&shared));
        Watch { shared }
    }

    /// The engine sent something now.
    pub fn progress(&self) {
        self.shared.last_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// On the wake-up: whether the engine really has been silent for the deadline (a message may have
    /// come since the thread looked); if not, the watch goes on.
    pub fn missed(&self) -> bool {
        let silent = now_ms().saturating_sub(self.shared.last_ms.load(Ordering::Relaxed));
        let missed = silent >= self.shared.budget_ms;
        if !missed {
            self.shared.fired.store(false, Ordering::Release);
        }
        missed
    }

    pub fn budget(&self) -> Duration {
        Duration::from_millis(self.shared.budget_ms)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut scheduler = self.shared.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = scheduler.take() {
            // SAFETY: created by `scheduler_new`, deleted once, with no commit in progress (the lock).
            unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(s.0) };
        }
    }
}
