//! The timers of module-path streams: the inter-token deadline (the ext_proc path's is
//! `extproc_core::stream`'s `deadline.rs`, run by extproc's server), the flush of held stream bytes
//! (`stream_flush_ms`) and the gateway's shutdown (the stop file extproc creates when its shutdown grace
//! ran out). A stream whose timer fell due is woken on its worker thread (Envoy's filter scheduler) to
//! end the answer or to send what it holds.
//!
//! Envoy gives a filter no timer of its own, so one thread for the whole module watches every stream
//! that has a timer. A token costs the stream one clock read and one atomic store (`Watch::progress`);
//! the thread looks at the watches at least every `TICK`, and is woken sooner when a flush falls due
//! before its next look.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::abi;

/// The longest the thread sleeps between looks.
const TICK: Duration = Duration::from_millis(50);

/// The event id the scheduler delivers to `HttpFilter::scheduled` when a deadline passed.
pub const DEADLINE_EVENT: u64 = 1;
/// The event id delivered when held stream bytes are due to go to the client.
pub const FLUSH_EVENT: u64 = 2;
/// The event id delivered when the gateway is stopping: open answers end now.
pub const SHUTDOWN_EVENT: u64 = 3;

/// The engine has sent nothing yet (`Shared::last_ms`): the deadline is not running.
const NOT_STARTED: u64 = u64::MAX;

/// No flush is armed (`Shared::flush_due_ms`).
const NO_FLUSH: u64 = u64::MAX;

/// Envoy's scheduler of one filter, deleted once (by the watch's owner).
struct Scheduler(abi::SchedulerPtr);

// SAFETY: Envoy's filter scheduler may be committed from any thread (that is its purpose); deletion and
// commits are serialised by the watch's mutex.
unsafe impl Send for Scheduler {}

struct Shared {
    scheduler: Mutex<Option<Scheduler>>,
    /// Milliseconds since `epoch()` of the engine's last message.
    last_ms: AtomicU64,
    /// The inter-token deadline; `u64::MAX`: none.
    budget_ms: u64,
    /// The deadline's wake-up was sent and not answered yet.
    fired: AtomicBool,
    /// When held bytes must go out (ms since `epoch()`); `NO_FLUSH`: nothing held.
    flush_due_ms: AtomicU64,
}

impl Shared {
    fn commit(&self, event_id: u64) {
        let scheduler = self.scheduler.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = scheduler.as_ref() {
            // SAFETY: the scheduler is alive while held under the lock (Drop deletes it under the same
            // lock).
            unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(s.0, event_id) };
        }
    }
}

/// One stream's timers, owned by its filter; dropping it stops the watch (before the filter goes).
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

/// The watched streams and the thread's wake-up; `NEXT_LOOK_MS` is when the thread looks next.
struct Watches {
    list: Mutex<Vec<Weak<Shared>>>,
    wake: Condvar,
}

static NEXT_LOOK_MS: AtomicU64 = AtomicU64::new(0);

/// The stop files of the filter configs (`stop_file`), looked for at every look of the thread.
static STOP_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// A stop file appeared: every open answer was told, and new ones end at once (`stopping`).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Watch for `path`: when it exists, the gateway is stopping (extproc's shutdown grace ran out).
pub fn watch_stop_file(path: PathBuf) {
    let mut files = STOP_FILES.lock().unwrap_or_else(|p| p.into_inner());
    if !files.contains(&path) {
        files.push(path);
    }
    // The thread must run to look for it.
    let _ = watches();
}

/// Whether the gateway is stopping (a stop file appeared).
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Acquire)
}

fn stop_file_appeared() -> bool {
    let files = STOP_FILES.lock().unwrap_or_else(|p| p.into_inner());
    files.iter().any(|f| f.exists())
}

fn watches() -> &'static Watches {
    static WATCHES: OnceLock<Watches> = OnceLock::new();
    WATCHES.get_or_init(|| {
        std::thread::Builder::new()
            .name("extproc-timers".into())
            .spawn(watch_loop)
            .expect("the timer thread starts");
        Watches {
            list: Mutex::new(Vec::new()),
            wake: Condvar::new(),
        }
    })
}

fn watch_loop() {
    let watches = watches();
    let mut list = watches.list.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = now_ms();
        let mut next = now + TICK.as_millis() as u64;
        let stop_now = !stopping() && stop_file_appeared();
        if stop_now {
            STOPPING.store(true, Ordering::Release);
        }
        list.retain(|weak| {
            let Some(watch) = weak.upgrade() else { return false };
            if stop_now {
                watch.commit(SHUTDOWN_EVENT);
            }
            let due = watch.last_ms.load(Ordering::Relaxed).saturating_add(watch.budget_ms);
            if due <= now {
                if !watch.fired.swap(true, Ordering::AcqRel) {
                    watch.commit(DEADLINE_EVENT);
                }
            } else {
                next = next.min(due);
            }
            let flush = watch.flush_due_ms.load(Ordering::Acquire);
            if flush <= now {
                // Once per armed flush: the filter arms it again when it holds bytes again.
                if watch
                    .flush_due_ms
                    .compare_exchange(flush, NO_FLUSH, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    watch.commit(FLUSH_EVENT);
                }
            } else {
                next = next.min(flush);
            }
            true
        });
        NEXT_LOOK_MS.store(next, Ordering::Release);
        let sleep = Duration::from_millis(next.saturating_sub(now_ms()).max(1));
        list = watches
            .wake
            .wait_timeout(list, sleep)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

impl Watch {
    /// Watch a stream, waking it through its filter's `scheduler` (`Stream::new_scheduler`, owned from
    /// now on): after `deadline` of engine silence once the engine sent something (`None`: never), when
    /// an armed flush falls due, and when the gateway stops.
    pub fn start(scheduler: abi::SchedulerPtr, deadline: Option<Duration>) -> Watch {
        let shared = Arc::new(Shared {
            scheduler: Mutex::new(Some(Scheduler(scheduler))),
            last_ms: AtomicU64::new(NOT_STARTED),
            budget_ms: deadline.map_or(u64::MAX, |d| d.as_millis().max(1) as u64),
            fired: AtomicBool::new(false),
            flush_due_ms: AtomicU64::new(NO_FLUSH),
        });
        watches()
            .list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::downgrade(&shared));
        Watch { shared }
    }

    /// The engine sent something now (the deadline runs from the first).
    pub fn progress(&self) {
        if self.shared.budget_ms != u64::MAX {
            self.shared.last_ms.store(now_ms(), Ordering::Relaxed);
        }
    }

    /// On the wake-up: whether the engine really has been silent for the deadline (a message may have
    /// come since the thread looked); if not, the watch goes on.
    pub fn missed(&self) -> bool {
        let last = self.shared.last_ms.load(Ordering::Relaxed);
        let silent = if last == NOT_STARTED {
            0
        } else {
            now_ms().saturating_sub(last)
        };
        let missed = silent >= self.shared.budget_ms;
        if !missed {
            self.shared.fired.store(false, Ordering::Release);
        }
        missed
    }

    pub fn budget(&self) -> Duration {
        Duration::from_millis(self.shared.budget_ms)
    }

    /// Held bytes must go out `after` from now (if no flush is armed yet); the thread is woken when
    /// that is before its next look.
    pub fn arm_flush(&self, after: Duration) {
        let due = now_ms() + after.as_millis() as u64;
        let armed = self
            .shared
            .flush_due_ms
            .compare_exchange(NO_FLUSH, due, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if armed && due < NEXT_LOOK_MS.load(Ordering::Acquire) {
            let watches = watches();
            // Under the lock, so the notice cannot fall between the thread's look and its wait.
            let _list = watches.list.lock().unwrap_or_else(|p| p.into_inner());
            NEXT_LOOK_MS.store(due, Ordering::Release);
            watches.wake.notify_one();
        }
    }

    /// The held bytes went out with a message: no flush is due.
    pub fn disarm_flush(&self) {
        self.shared.flush_due_ms.store(NO_FLUSH, Ordering::Release);
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
