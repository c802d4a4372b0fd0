//! Sessions resident on each endpoint: the session keys (`x-session-id` or `user`) that have come back
//! (two requests or more) and whose last request was routed there within a window. Between turns a
//! session has nothing in flight, so the endpoint's load does not show it, but its next turn will
//! prefill there (it follows its history). The affinity policies may price them for a session's first
//! request (`resident_session_tokens`): new sessions then spread over the endpoints instead of piling
//! on the few holding a shared preamble. A request of a session already seen is not priced: it follows
//! its history, and moving it would prefill that again elsewhere. Single-turn keys (one request each)
//! never count.
//!
//! One mutex: a pick with the term on takes it twice for a few hash-map operations (the counts before
//! ranking, its own session's entry after), and expiry runs in those critical sections.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::endpoint_set::EndpointId;
use super::membership::Tick;

/// Requests tracked at most: past it the oldest are dropped first (a bound on memory, not a window).
const MAX_TRACKED: usize = 1 << 20;

pub struct Residents {
    window: Tick,
    inner: Mutex<Inner>,
    /// The oldest entry's expiry tick: a pick takes the lock to expire only once one is due.
    next_due: AtomicU32,
}

#[derive(Clone, Copy)]
struct Session {
    /// Where its last request went, and when.
    at: EndpointId,
    last: Tick,
    /// Its requests seen (within the window of each other): it counts as resident from 2 on.
    requests: u32,
}

impl Session {
    fn resident(&self) -> bool {
        self.requests >= 2
    }
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<u64, Session>,
    /// (tick, session) per request, oldest first; an entry whose session was seen since is stale.
    queue: VecDeque<(Tick, u64)>,
    /// Resident sessions per endpoint id.
    counts: Vec<u32>,
}

impl Inner {
    fn count(&mut self, id: EndpointId, add: bool) {
        if self.counts.len() <= id {
            self.counts.resize(id + 1, 0);
        }
        if add {
            self.counts[id] += 1;
        } else {
            self.counts[id] = self.counts[id].saturating_sub(1);
        }
    }

    /// Drops `key` if the request at `tick` was its last (else a later one keeps it).
    fn drop_if_last(&mut self, tick: Tick, key: u64) {
        if let Some(s) = self.sessions.get(&key).copied() {
            if s.last == tick {
                self.sessions.remove(&key);
                if s.resident() {
                    self.count(s.at, false);
                }
            }
        }
    }
}

impl Residents {
    /// `window`: how long after its last request a session is remembered, in ticks (positive).
    pub fn new(window: Tick) -> Self {
        Residents {
            window: window.max(1),
            inner: Mutex::new(Inner::default()),
            next_due: AtomicU32::new(Tick::MAX),
        }
    }

    /// The resident sessions on each of `ids` at `now` (`out[i]` for `ids[i]`), for a request of
    /// session `own` (`None`: no key); `None` when `own` has been seen within the window (the
    /// request follows its history, unpriced).
    pub fn for_new_session(
        &self,
        ids: impl Iterator<Item = EndpointId>,
        own: Option<u64>,
        now: Tick,
    ) -> Option<Vec<u32>> {
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        if own.is_some_and(|k| inner.sessions.contains_key(&k)) {
            return None;
        }
        Some(ids.map(|id| inner.counts.get(id).copied().unwrap_or(0)).collect())
    }

    /// Session `key`'s request went to endpoint `id` at `now`.
    pub fn routed(&self, key: u64, id: EndpointId, now: Tick) {
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        let before = inner.sessions.get(&key).copied();
        if let Some(s) = before.filter(Session::resident) {
            inner.count(s.at, false);
        }
        let s = Session {
            at: id,
            last: now,
            requests: before.map_or(1, |s| s.requests.saturating_add(1)),
        };
        inner.sessions.insert(key, s);
        if s.resident() {
            inner.count(id, true);
        }
        inner.queue.push_back((now, key));
        if inner.queue.len() > MAX_TRACKED {
            if let Some((tick, key)) = inner.queue.pop_front() {
                inner.drop_if_last(tick, key);
            }
        }
        self.set_due(&inner);
    }

    /// Forgets the sessions on `id` (an endpoint removed; its id may be reused).
    pub fn clear(&self, id: EndpointId) {
        let mut inner = self.lock();
        inner.sessions.retain(|_, s| s.at != id);
        if let Some(n) = inner.counts.get_mut(id) {
            *n = 0;
        }
    }

    fn expire(&self, inner: &mut Inner, now: Tick) {
        if now < self.next_due.load(Ordering::Relaxed) {
            return;
        }
        while let Some(&(tick, key)) = inner.queue.front() {
            if tick.saturating_add(self.window) > now {
                break;
            }
            inner.queue.pop_front();
            inner.drop_if_last(tick, key);
        }
        self.set_due(inner);
    }

    fn set_due(&self, inner: &Inner) {
        let due = inner
            .queue
            .front()
            .map_or(Tick::MAX, |&(tick, _)| tick.saturating_add(self.window));
        self.next_due.store(due, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock means a panic mid-update elsewhere; the counts are plain numbers.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(r: &Residents, own: Option<u64>, now: Tick) -> Option<Vec<u32>> {
        r.for_new_session(0..3, own, now)
    }

    #[test]
    fn a_session_that_came_back_resides_where_its_last_request_went_until_the_window_ends() {
        let r = Residents::new(50);
        // One request each: seen, not resident.
        r.routed(1, 0, 0);
        r.routed(2, 0, 5);
        r.routed(3, 1, 5);
        assert_eq!(counts(&r, None, 6), Some(vec![0, 0, 0]));
        // Their second requests make them resident where they went.
        r.routed(1, 0, 10);
        r.routed(2, 0, 10);
        r.routed(3, 1, 10);
        assert_eq!(counts(&r, None, 20), Some(vec![2, 1, 0]));
        assert_eq!(counts(&r, Some(9), 20), Some(vec![2, 1, 0]), "a new session sees them");
        // A request of a session seen in the window is not priced.
        assert_eq!(counts(&r, Some(1), 20), None);
        // Session 1 moves to endpoint 2: it leaves 0.
        r.routed(1, 2, 30);
        assert_eq!(counts(&r, None, 30), Some(vec![1, 1, 1]));
        // Sessions 2 and 3 (last request at 10) expire at 60, session 1 (30) at 80; their earlier
        // requests' stale entries drop nothing.
        assert_eq!(counts(&r, None, 59), Some(vec![1, 1, 1]));
        assert_eq!(counts(&r, None, 60), Some(vec![0, 0, 1]));
        assert_eq!(counts(&r, Some(2), 60), Some(vec![0, 0, 1]), "forgotten: new again");
        assert_eq!(counts(&r, None, 80), Some(vec![0, 0, 0]));
    }

    #[test]
    fn clearing_an_endpoint_forgets_its_sessions() {
        let r = Residents::new(50);
        for tick in [0, 1] {
            r.routed(1, 0, tick);
            r.routed(2, 1, tick);
        }
        r.clear(0);
        assert_eq!(counts(&r, None, 2), Some(vec![0, 1, 0]));
        assert_eq!(counts(&r, Some(1), 2), Some(vec![0, 1, 0]), "session 1 is forgotten");
        // The cleared session's queue entries expire without touching the counts.
        assert_eq!(counts(&r, None, 60), Some(vec![0, 0, 0]));
        r.routed(1, 0, 70);
        r.routed(1, 0, 71);
        assert_eq!(counts(&r, None, 72), Some(vec![1, 0, 0]));
    }
}
