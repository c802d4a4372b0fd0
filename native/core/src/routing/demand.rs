//! Each endpoint's recent demand: the requests sent to it, decayed exponentially over a window
//! (`demand_window_s`). The underused-endpoint test (`underused_share`, `policy/affinity.rs` point 6)
//! compares it with the pool's mean: a lasting imbalance that in-flight counts, which drain between
//! requests at light load, do not show.

use std::sync::Mutex;

use super::membership::Tick;

/// Requests sent to one endpoint, decayed by `exp(-elapsed / window)`: a request `window` ago counts
/// 0.37, one three windows ago 0.05.
#[derive(Default)]
pub struct RecentRequests {
    /// The count as of the tick beside it.
    state: Mutex<(f64, Tick)>,
}

impl RecentRequests {
    /// One more request at `now`.
    pub fn add(&self, now: Tick, window: Tick) {
        let mut s = self.lock();
        s.0 = decayed(s.0, s.1, now, window) + 1.0;
        s.1 = s.1.max(now);
    }

    /// The count at `now`.
    pub fn at(&self, now: Tick, window: Tick) -> f64 {
        let s = self.lock();
        decayed(s.0, s.1, now, window)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (f64, Tick)> {
        // A poisoned lock means a panic mid-update elsewhere; the pair is still a count and a tick.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn decayed(count: f64, since: Tick, now: Tick, window: Tick) -> f64 {
    let elapsed = f64::from(now.saturating_sub(since));
    count * (-elapsed / f64::from(window.max(1))).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_fade_over_the_window() {
        let r = RecentRequests::default();
        assert_eq!(r.at(0, 50), 0.0);
        r.add(10, 50);
        r.add(10, 50);
        assert_eq!(r.at(10, 50), 2.0);
        assert!((r.at(60, 50) - 2.0 * (-1.0f64).exp()).abs() < 1e-9, "one window later");
        r.add(60, 50);
        assert!((r.at(60, 50) - (1.0 + 2.0 * (-1.0f64).exp())).abs() < 1e-9);
        assert!(r.at(400, 50) < 0.01, "long gone");
        // A tick older than the last (two picks racing) adds without decaying the count backwards.
        r.add(59, 50);
        assert!(r.at(60, 50) > 2.0);
    }
}
