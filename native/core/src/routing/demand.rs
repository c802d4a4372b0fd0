//! Each endpoint's recent demand: the requests sent to it, decayed exponentially over a window
//! (`demand_window_s`). The underused-endpoint test (`underused_share`, `policy/affinity.rs` point 6)
//! compares it with the pool's mean: a lasting imbalance that in-flight counts, which drain between
//! requests at light load, do not show.
//!
//! A count is kept as its level, `ln(count) + tick / window`. Decay shrinks every count by the same
//! factor, so a level moves only when requests are added, and levels compare as their counts do at any
//! moment: the load order keeps endpoints sorted by level (`load_order.rs`), and one more count, the
//! pool's total, gives the mean without visiting every endpoint (`Router::underused_below`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::membership::Tick;

/// Requests sent to one endpoint (or a pool), decayed by `exp(-elapsed / window)`: a request `window`
/// ago counts 0.37, one three windows ago 0.05.
pub struct RecentRequests {
    /// The level's bits (`f64::NEG_INFINITY`: nothing yet); lock-free, as every pick adds to the pool's.
    level: AtomicU64,
}

impl Default for RecentRequests {
    fn default() -> Self {
        RecentRequests {
            level: AtomicU64::new(f64::NEG_INFINITY.to_bits()),
        }
    }
}

impl RecentRequests {
    /// `n` more requests at `now` (negative: taken out, as when an endpoint leaves the pool; the count
    /// never goes below 0). A `now` older than an earlier add's (two picks racing) counts at its own
    /// time: the level needs no order.
    pub fn add(&self, n: f64, now: Tick, window: Tick) {
        let mut old = self.level.load(Ordering::Relaxed);
        loop {
            let count = (count_at(f64::from_bits(old), now, window) + n).max(0.0);
            let new = level_of(count, now, window).to_bits();
            match self
                .level
                .compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(current) => old = current,
            }
        }
    }

    /// The count at `now`.
    pub fn at(&self, now: Tick, window: Tick) -> f64 {
        count_at(self.level(), now, window)
    }

    /// The level, which orders endpoints by their counts whatever the time.
    pub fn level(&self) -> f64 {
        f64::from_bits(self.level.load(Ordering::Relaxed))
    }
}

/// The level of `count` requests at `now`: below it, an endpoint's count at `now` is below `count`.
pub fn level_of(count: f64, now: Tick, window: Tick) -> f64 {
    // ln(0) is -inf: no requests is below every level.
    count.ln() + f64::from(now) / f64::from(window.max(1))
}

/// The share by which `count` exceeds `mean` (`busy_miss_weight`): `count / mean - 1`, 0 at or below
/// the mean.
pub fn busy_share(count: f64, mean: f64) -> f64 {
    (count / mean - 1.0).max(0.0)
}

/// The count at `now` of a level (`RecentRequests::level`).
pub fn count_at(level: f64, now: Tick, window: Tick) -> f64 {
    (level - f64::from(now) / f64::from(window.max(1))).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn requests_fade_over_the_window() {
        let r = RecentRequests::default();
        assert_eq!(r.at(0, 50), 0.0);
        r.add(1.0, 10, 50);
        r.add(1.0, 10, 50);
        assert!(close(r.at(10, 50), 2.0));
        assert!(close(r.at(60, 50), 2.0 * (-1.0f64).exp()), "one window later");
        r.add(1.0, 60, 50);
        assert!(close(r.at(60, 50), 1.0 + 2.0 * (-1.0f64).exp()));
        assert!(r.at(400, 50) < 0.01, "long gone");
        // A tick older than the last (two picks racing) counts as a request at that tick.
        r.add(1.0, 59, 50);
        assert!(close(
            r.at(60, 50),
            1.0 + 2.0 * (-1.0f64).exp() + (-1.0f64 / 50.0).exp()
        ));
        // Taking out more than is there leaves nothing.
        r.add(-10.0, 60, 50);
        assert_eq!(r.at(60, 50), 0.0);
    }

    #[test]
    fn levels_order_endpoints_as_their_counts_whenever_read() {
        let (busy, idle, old) = (
            RecentRequests::default(),
            RecentRequests::default(),
            RecentRequests::default(),
        );
        for _ in 0..4 {
            busy.add(1.0, 100, 50);
        }
        idle.add(1.0, 100, 50);
        // Five requests two windows ago count less now than one just sent.
        for _ in 0..5 {
            old.add(1.0, 0, 50);
        }
        assert!(old.at(100, 50) < idle.at(100, 50));
        assert!(old.level() < idle.level() && idle.level() < busy.level());
        // A level cut at 2 requests separates the counts below 2, at any later tick as well.
        for now in [100, 130, 400] {
            let cut = level_of(2.0, now, 50);
            for r in [&busy, &idle, &old] {
                assert_eq!(r.level() < cut, r.at(now, 50) < 2.0, "at tick {now}");
            }
        }
        assert!(
            RecentRequests::default().level() < level_of(1e-9, 0, 50),
            "none is below any count"
        );
    }
}
