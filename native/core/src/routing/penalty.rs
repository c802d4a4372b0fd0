//! The router's own view of an endpoint's failures (docs/reliability.md, "Failing engines"): an engine
//! that fails at once holds no requests and looks idle to every load-based policy, so without a record of
//! its failures it would draw the most traffic. Streams report each engine call's outcome here; picks
//! skip an ejected endpoint while any candidate is not ejected.
//!
//! The state machine, per endpoint:
//!
//! - **closed** (no failures): picked as usual.
//! - a failure while closed or while probing makes `k` (consecutive failures) one more and **ejects** the
//!   endpoint until `now + backoff(k)`, where
//!
//!   `backoff(k) = min(base × 2^(k−1), max)`
//!
//!   with `base` 1 s and `max` 30 s for an endpoint that is down (UNAVAILABLE, INTERNAL, a failed or
//!   reset connection, a missed first-token or inter-token deadline) and `base` 250 ms and `max` 5 s for
//!   one that is busy (RESOURCE_EXHAUSTED: alive but full, so it is tried again sooner). Failures
//!   reported while ejected (requests that were already in flight) change nothing: they are old news.
//! - once the backoff ran out the endpoint is **half-open**: one request (the probe) may go to it; others
//!   skip it until the probe's outcome is known. A probe that ends without an outcome (the client went
//!   away) frees the slot for the next one.
//! - any success (the engine answered or streamed a token) **closes** it again: `k` back to 0.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Why an engine call failed, as far as the endpoint's penalty goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Not serving: UNAVAILABLE, INTERNAL, a failed or reset connection, a missed deadline.
    Down,
    /// Alive but refusing work for now: RESOURCE_EXHAUSTED.
    Busy,
}

/// The growth of one kind of ejection: `min(base × 2^(k−1), max)` after `k` consecutive failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const DOWN: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };
    pub const BUSY: Backoff = Backoff {
        base: Duration::from_millis(250),
        max: Duration::from_secs(5),
    };

    /// How long the `failures`-th consecutive failure ejects the endpoint (`failures` ≥ 1).
    pub fn after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(20);
        self.base.saturating_mul(1 << doublings).min(self.max)
    }

    fn of(failure: Failure) -> Backoff {
        match failure {
            Failure::Down => Backoff::DOWN,
            Failure::Busy => Backoff::BUSY,
        }
    }
}

/// Where an endpoint stands for new picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// No recent failure.
    Closed,
    /// Its backoff runs: skipped while another candidate is not ejected.
    Ejected,
    /// Its backoff ran out: the next pick may probe it (`probe_free`), or a probe is out.
    HalfOpen { probe_free: bool },
}

impl Standing {
    /// Whether a pick may choose the endpoint while other candidates exist.
    pub fn admits(self) -> bool {
        matches!(self, Standing::Closed | Standing::HalfOpen { probe_free: true })
    }
}

#[derive(Debug, Default)]
struct State {
    /// Consecutive failures (`k`).
    failures: u32,
    /// End of the current ejection, while `failures` > 0.
    until: Option<Instant>,
    /// The probe out now, by number; `next_probe` numbers the next.
    probe: Option<u64>,
    next_probe: u64,
}

/// One endpoint's failure record. Cheap when closed: one atomic load per pick, no lock (a pick reads
/// every endpoint's standing, thousands of them in a large pool).
#[derive(Debug, Default)]
pub struct Penalty {
    state: Mutex<State>,
    /// `state.until.is_some()`, written under the lock: false means closed.
    failing: AtomicBool,
}

impl Penalty {
    pub fn standing(&self, now: Instant) -> Standing {
        if !self.failing.load(Ordering::Acquire) {
            return Standing::Closed;
        }
        let s = self.lock();
        match s.until {
            None => Standing::Closed,
            Some(until) if now < until => Standing::Ejected,
            Some(_) => Standing::HalfOpen {
                probe_free: s.probe.is_none(),
            },
        }
    }

    /// A pick chose the endpoint: if it is half-open with its probe slot free, this request is the
    /// probe; its number comes back (hand it to `probe_ended` when the request ends).
    pub fn picked(&self, now: Instant) -> Option<u64> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        let mut s = self.lock();
        let half_open = s.until.is_some_and(|until| now >= until);
        if !half_open || s.probe.is_some() {
            return None;
        }
        let probe = s.next_probe;
        s.next_probe += 1;
        s.probe = Some(probe);
        Some(probe)
    }

    /// A probe's request ended; if no outcome was reported for it, the slot is free for the next one.
    pub fn probe_ended(&self, probe: u64) {
        let mut s = self.lock();
        if s.probe == Some(probe) {
            s.probe = None;
        }
    }

    /// An engine call on the endpoint failed.
    pub fn failed(&self, failure: Failure, now: Instant) {
        let mut s = self.lock();
        if s.until.is_some_and(|until| now < until) {
            return; // already ejected: a request from before the ejection
        }
        s.failures = s.failures.saturating_add(1);
        s.until = Some(now + Backoff::of(failure).after(s.failures));
        s.probe = None;
        self.failing.store(true, Ordering::Release);
    }

    /// An engine call on the endpoint succeeded (or proved the engine alive).
    pub fn succeeded(&self) {
        let mut s = self.lock();
        if s.until.is_some() {
            s.failures = 0;
            s.until = None;
            s.probe = None;
            self.failing.store(false, Ordering::Release);
        }
    }

    /// Whether failures are on record (else the standing is `Closed`, whatever the time).
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// Consecutive failures so far (0: closed).
    pub fn failures(&self) -> u32 {
        self.lock().failures
    }

    // A poisoned lock means a panic mid-update of plain numbers: still usable.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_doubles_per_failure_up_to_its_cap() {
        let down: Vec<u64> = (1..=7).map(|k| Backoff::DOWN.after(k).as_secs()).collect();
        assert_eq!(down, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(Backoff::BUSY.after(1), 250 * MS);
        assert_eq!(Backoff::BUSY.after(3), 1000 * MS);
        assert_eq!(Backoff::BUSY.after(10), Duration::from_secs(5));
        assert_eq!(Backoff::DOWN.after(u32::MAX), Duration::from_secs(30), "no overflow");
    }

    #[test]
    fn a_failure_ejects_until_the_backoff_ends_then_one_probe_goes() {
        let p = Penalty::default();
        let t0 = Instant::now();
        assert_eq!(p.standing(t0), Standing::Closed);
        assert_eq!(p.picked(t0), None, "a closed endpoint takes no probe");
        p.failed(Failure::Down, t0);
        assert_eq!(p.standing(t0 + 999 * MS), Standing::Ejected);
        assert!(!p.standing(t0 + 999 * MS).admits());
        let t1 = t0 + 1000 * MS;
        assert_eq!(p.standing(t1), Standing::HalfOpen { probe_free: true });
        assert!(p.standing(t1).admits());
        let probe = p.picked(t1).expect("the first pick after the backoff probes");
        assert_eq!(p.standing(t1), Standing::HalfOpen { probe_free: false });
        assert!(!p.standing(t1).admits(), "one probe at a time");
        assert_eq!(p.picked(t1), None);
        p.probe_ended(probe);
        assert_eq!(
            p.standing(t1),
            Standing::HalfOpen { probe_free: true },
            "a lost probe frees the slot"
        );
    }

    #[test]
    fn a_failed_probe_ejects_for_twice_as_long_and_a_success_closes() {
        let p = Penalty::default();
        let t0 = Instant::now();
        p.failed(Failure::Down, t0);
        let t1 = t0 + Duration::from_secs(1);
        let probe = p.picked(t1).unwrap();
        p.failed(Failure::Down, t1);
        assert_eq!(p.failures(), 2);
        p.probe_ended(probe); // after its outcome: changes nothing
        assert_eq!(p.standing(t1 + 1999 * MS), Standing::Ejected);
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(p.standing(t2), Standing::HalfOpen { probe_free: true });
        p.picked(t2).unwrap();
        p.succeeded();
        assert_eq!((p.standing(t2), p.failures()), (Standing::Closed, 0));
        p.failed(Failure::Down, t2);
        assert_eq!(
            p.standing(t2 + 999 * MS),
            Standing::Ejected,
            "counting starts over after a success"
        );
        assert_eq!(p.standing(t2 + 1000 * MS), Standing::HalfOpen { probe_free: true });
    }

    #[test]
    fn failures_of_requests_already_in_flight_do_not_compound() {
        let p = Penalty::default();
        let t0 = Instant::now();
        for i in 0..10 {
            p.failed(Failure::Down, t0 + i * MS);
        }
        assert_eq!(p.failures(), 1);
        assert_eq!(p.standing(t0 + 1000 * MS), Standing::HalfOpen { probe_free: true });
    }

    #[test]
    fn a_busy_engine_is_tried_again_sooner_than_a_dead_one() {
        let busy = Penalty::default();
        let t0 = Instant::now();
        busy.failed(Failure::Busy, t0);
        assert_eq!(busy.standing(t0 + 249 * MS), Standing::Ejected);
        assert!(busy.standing(t0 + 250 * MS).admits());
        let down = Penalty::default();
        down.failed(Failure::Down, t0);
        assert_eq!(down.standing(t0 + 250 * MS), Standing::Ejected);
    }

    #[test]
    fn a_stale_probe_end_does_not_free_a_newer_probe() {
        let p = Penalty::default();
        let t0 = Instant::now();
        p.failed(Failure::Busy, t0);
        let t1 = t0 + Duration::from_secs(1);
        let first = p.picked(t1).unwrap();
        p.failed(Failure::Busy, t1); // the probe failed: ejected for 500 ms
        let t2 = t1 + Duration::from_secs(1);
        let second = p.picked(t2).unwrap();
        assert_ne!(first, second);
        p.probe_ended(first);
        assert_eq!(p.standing(t2), Standing::HalfOpen { probe_free: false });
        p.probe_ended(second);
        assert_eq!(p.standing(t2), Standing::HalfOpen { probe_free: true });
    }
}
