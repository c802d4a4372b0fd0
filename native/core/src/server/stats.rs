//! What the server counts and remembers for the control plane's metrics and logs: a few atomic
//! counters, and a bounded queue of finished requests that Python drains now and then.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::stream::Summary;

#[derive(Debug, Default)]
pub struct Counters {
    pub streams_started: AtomicU64,
    pub streams_finished: AtomicU64,
    pub aborts_sent: AtomicU64,
    pub aborts_failed: AtomicU64,
    /// Finished requests that found the queue full and pushed out the oldest.
    pub summaries_dropped: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `(name, value)` pairs, in a stable order.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("streams_started", get(&self.streams_started)),
            ("streams_finished", get(&self.streams_finished)),
            ("aborts_sent", get(&self.aborts_sent)),
            ("aborts_failed", get(&self.aborts_failed)),
            ("summaries_dropped", get(&self.summaries_dropped)),
        ]
    }
}

/// One ext_proc stream, once it ended.
#[derive(Debug, Clone)]
pub struct Finished {
    pub summary: Summary,
    /// The client went away while the engine was generating, and an Abort was sent.
    pub aborted: bool,
    /// From the first ext_proc message to the end of the stream.
    pub duration: Duration,
}

/// Shared by the server's streams and its Python handle; outlives any one start/stop.
#[derive(Debug)]
pub struct Telemetry {
    pub counters: Counters,
    capacity: usize,
    finished: Mutex<VecDeque<Finished>>,
}

impl Telemetry {
    /// Keep at most `capacity` finished requests until they are taken (0: keep none).
    pub fn new(capacity: usize) -> Self {
        Telemetry {
            counters: Counters::default(),
            capacity,
            finished: Mutex::new(VecDeque::new()),
        }
    }

    /// A stream ended; `finished` describes it, and runs only when summaries are kept.
    pub fn record(&self, finished: impl FnOnce() -> Finished) {
        Counters::bump(&self.counters.streams_finished);
        if self.capacity == 0 {
            return;
        }
        let finished = finished();
        let mut queue = self.finished.lock().expect("summary queue lock");
        if queue.len() >= self.capacity {
            queue.pop_front();
            Counters::bump(&self.counters.summaries_dropped);
        }
        queue.push_back(finished);
    }

    /// Everything finished since the last call, oldest first.
    pub fn take(&self) -> Vec<Finished> {
        let mut queue = self.finished.lock().expect("summary queue lock");
        queue.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(id: &str) -> Finished {
        Finished {
            summary: Summary {
                request_id: id.into(),
                ..Summary::default()
            },
            aborted: false,
            duration: Duration::ZERO,
        }
    }

    #[test]
    fn the_queue_keeps_the_newest_and_counts_what_it_dropped() {
        let t = Telemetry::new(2);
        for id in ["a", "b", "c"] {
            t.record(|| finished(id));
        }
        let ids: Vec<_> = t.take().into_iter().map(|f| f.summary.request_id).collect();
        assert_eq!(ids, ["b", "c"]);
        assert!(t.take().is_empty());
        let counts: std::collections::HashMap<_, _> = t.counters.snapshot().into_iter().collect();
        assert_eq!(counts["streams_finished"], 3);
        assert_eq!(counts["summaries_dropped"], 1);
    }

    #[test]
    fn a_zero_capacity_keeps_nothing_but_still_counts() {
        let t = Telemetry::new(0);
        t.record(|| finished("a"));
        assert!(t.take().is_empty());
        assert_eq!(t.counters.streams_finished.load(Ordering::Relaxed), 1);
        assert_eq!(t.counters.summaries_dropped.load(Ordering::Relaxed), 0);
    }
}
