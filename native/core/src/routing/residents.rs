//! Sessions resident on each endpoint: the distinct session keys (`x-session-id` or `user`) whose last
//! request was routed there within a window. A session between turns has nothing in flight, so the
//! endpoint's load does not show it; its next turn will prefill there all the same (it follows its
//! history). The affinity policies may price them (`resident_session_tokens`): new sessions then
//! spread over the endpoints instead of piling on the few holding a shared preamble.
//!
//! One mutex: a pick with the term on takes it twice for a few hash-map operations (its counts before
//! ranking, its own session's move after), and expiry runs in those critical sections.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::endpoint_set::EndpointId;
use super::membership::Tick;

/// Sessions tracked at most: past it the oldest are dropped first (a bound on memory, not a window).
const MAX_SESSIONS: usize = 1 << 20;

pub struct Residents {
    window: Tick,
    inner: Mutex<Inner>,
    /// The oldest entry's expiry tick: a pick takes the lock to expire only once one is due.
    next_due: AtomicU32,
}

#[derive(Default)]
struct Inner {
    /// Session key hash → (its endpoint, the tick of its last request).
    sessions: HashMap<u64, (EndpointId, Tick)>,
    /// (tick, session) per request, oldest first; an entry whose session was seen since is stale.
    queue: VecDeque<(Tick, u64)>,
    /// Sessions resident per endpoint id.
    counts: Vec<u32>,
}

impl Residents {
    /// `window`: how long after its last request a session stays resident, in ticks (positive).
    pub fn new(window: Tick) -> Self {
        Residents {
            window: window.max(1),
            inner: Mutex::new(Inner::default()),
            next_due: AtomicU32::new(Tick::MAX),
        }
    }

    /// Each id's resident sessions at `now`, not counting `own` (the request's session) where it
    /// resides: `out[i]` for `ids[i]`.
    pub fn counts(&self, ids: impl Iterator<Item = EndpointId>, own: Option<u64>, now: Tick) -> Vec<u32> {
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        let own_at = own.and_then(|k| inner.sessions.get(&k)).map(|&(id, _)| id);
        ids.map(|id| {
            let n = inner.counts.get(id).copied().unwrap_or(0);
            n - u32::from(own_at == Some(id) && n > 0)
        })
        .collect()
    }

    /// Session `key`'s request went to endpoint `id` at `now`: it resides there from now on.
    pub fn routed(&self, key: u64, id: EndpointId, now: Tick) {
        let mut inner = self.lock();
        self.expire(&mut inner, now);
        if let Some((old, _)) = inner.sessions.insert(key, (id, now)) {
            inner.counts[old] -= 1;
        }
        if inner.counts.len() <= id {
            inner.counts.resize(id + 1, 0);
        }
        inner.counts[id] += 1;
        inner.queue.push_back((now, key));
        if inner.queue.len() > MAX_SESSIONS {
            let (tick, key) = inner.queue.pop_front().unwrap_or_default();
            Self::drop_if_last(&mut inner, tick, key);
        }
        self.set_due(&inner);
    }

    /// Forgets the sessions resident on `id` (an endpoint removed; its id may be reused).
    pub fn clear(&self, id: EndpointId) {
        let mut inner = self.lock();
        inner.sessions.retain(|_, &mut (at, _)| at != id);
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
            Self::drop_if_last(inner, tick, key);
        }
        self.set_due(inner);
    }

    /// Drops `key` if the request at `tick` was its last (else a later one keeps it resident).
    fn drop_if_last(inner: &mut Inner, tick: Tick, key: u64) {
        if let Some(&(id, last)) = inner.sessions.get(&key) {
            if last == tick {
                inner.sessions.remove(&key);
                inner.counts[id] -= 1;
            }
        }
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

    fn counts(r: &Residents, own: Option<u64>, now: Tick) -> Vec<u32> {
        r.counts(0..3, own, now)
    }

    #[test]
    fn a_session_resides_where_its_last_request_went_until_the_window_ends() {
        let r = Residents::new(50);
        r.routed(1, 0, 0);
        r.routed(2, 0, 10);
        r.routed(3, 1, 10);
        assert_eq!(counts(&r, None, 20), vec![2, 1, 0]);
        // Its own session is not counted against the endpoint it resides on.
        assert_eq!(counts(&r, Some(1), 20), vec![1, 1, 0]);
        assert_eq!(counts(&r, Some(3), 20), vec![2, 0, 0]);
        // Session 1 moves to endpoint 2: it leaves 0.
        r.routed(1, 2, 30);
        assert_eq!(counts(&r, None, 30), vec![1, 1, 1]);
        // Session 2's and 3's last requests (tick 10) expire at 60; session 1's (30) at 80, and its
        // stale entry of tick 0 expiring at 50 does not drop it.
        assert_eq!(counts(&r, None, 59), vec![1, 1, 1]);
        assert_eq!(counts(&r, None, 60), vec![0, 0, 1]);
        assert_eq!(counts(&r, None, 80), vec![0, 0, 0]);
        // A request keeps its session resident.
        r.routed(4, 1, 100);
        r.routed(4, 1, 140);
        assert_eq!(counts(&r, None, 170), vec![0, 1, 0]);
        assert_eq!(counts(&r, None, 190), vec![0, 0, 0]);
    }

    #[test]
    fn clearing_an_endpoint_forgets_its_sessions() {
        let r = Residents::new(50);
        r.routed(1, 0, 0);
        r.routed(2, 1, 0);
        r.clear(0);
        assert_eq!(counts(&r, None, 1), vec![0, 1, 0]);
        // The cleared session's queue entry expires without touching the counts.
        assert_eq!(counts(&r, None, 60), vec![0, 0, 0]);
        r.routed(1, 0, 70);
        assert_eq!(counts(&r, None, 71), vec![1, 0, 0]);
    }
}
