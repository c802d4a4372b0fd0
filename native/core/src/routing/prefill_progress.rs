//! How far an endpoint has got through the prefill work this gateway sent it (`prefill_progress`).
//!
//! An endpoint's own prefill backlog (`Load::prefill_tokens`) counts a request's uncached tokens from
//! the pick until its first token comes back, whole: a 1,800-token prompt sent 300 ms ago still counts
//! 1,800 though the engine has done most of it. A request whose prefix that endpoint holds then looks
//! as if it waited behind all of it and goes elsewhere to prefill the prefix again (the suite's Zipf
//! shape at seed 0: two requests of 45, each a 500-token hit given up for about the same first-token
//! time). With this on, a holder's backlog is read as it stands: the tokens pending, less what the
//! endpoint's measured prefill speed has done since its current prefill began.
//!
//! - The current prefill began when the endpoint's pending count went from none to one, or at the last
//!   first token while others were still pending (the next one then runs): first tokens finish prefills
//!   in order, nearly, on an engine that schedules first come first served.
//! - The speed is learned per endpoint from its own requests: each first token of a request of at least
//!   `MIN_SAMPLE_TOKENS` uncached tokens gives its tokens over its time from pick to first token, and the
//!   endpoint keeps an exponential average. A request that queued behind others measures slower than
//!   the engine is, so the estimate errs low (less progress credited) when the engine is busy, and the
//!   backlog then reads as before.
//! - Nothing is credited before the first sample, and never more than is pending.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Requests with fewer uncached tokens are not timed: a step's fixed cost and the network dominate.
pub const MIN_SAMPLE_TOKENS: u64 = 256;
/// Weight of a new sample in the endpoint's average speed.
const SAMPLE_WEIGHT: f64 = 0.2;

/// Microseconds since the first call in this process: the clock of prefill progress.
pub fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// An endpoint's prefill clock: when its current prefill began and its learned speed.
#[derive(Debug, Default)]
pub struct PrefillClock {
    /// `now_us` when the endpoint's current prefill began.
    since_us: AtomicU64,
    /// Its average prefill speed in tokens per second, as `f64` bits (0: no sample yet).
    rate_bits: AtomicU64,
}

impl PrefillClock {
    /// A prefill began on an endpoint that had none pending, or one ended while others were pending.
    pub fn restart(&self, now_us: u64) {
        self.since_us.store(now_us, Ordering::Relaxed);
    }

    /// A request of `tokens` uncached tokens, picked at `began_us`, reached its first token at `now_us`.
    pub fn sample(&self, tokens: u64, began_us: u64, now_us: u64) {
        let elapsed_us = now_us.saturating_sub(began_us);
        if tokens < MIN_SAMPLE_TOKENS || elapsed_us == 0 {
            return;
        }
        let rate = tokens as f64 * 1e6 / elapsed_us as f64;
        let old = self.rate();
        let new = if old > 0.0 {
            old + SAMPLE_WEIGHT * (rate - old)
        } else {
            rate
        };
        self.rate_bits.store(new.to_bits(), Ordering::Relaxed);
    }

    /// Its average prefill speed in tokens per second; 0 before the first sample.
    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Relaxed))
    }

    /// `pending` prefill tokens less what the endpoint has done of them by `now_us`.
    pub fn remaining(&self, pending: u64, now_us: u64) -> u64 {
        let elapsed_s = now_us.saturating_sub(self.since_us.load(Ordering::Relaxed)) as f64 / 1e6;
        let done = (self.rate() * elapsed_s) as u64;
        pending.saturating_sub(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_credited_before_the_speed_is_measured() {
        let clock = PrefillClock::default();
        clock.restart(0);
        assert_eq!(clock.remaining(1_800, 5_000_000), 1_800);
    }

    #[test]
    fn a_prefill_under_way_shrinks_at_the_measured_speed() {
        let clock = PrefillClock::default();
        clock.sample(2_000, 1_000_000, 1_500_000); // 2,000 tokens in 0.5 s: 4,000 tokens/s
        assert_eq!(clock.rate(), 4_000.0);
        clock.restart(2_000_000);
        assert_eq!(clock.remaining(1_800, 2_000_000), 1_800);
        assert_eq!(clock.remaining(1_800, 2_300_000), 600, "0.3 s at 4,000 tokens/s");
        assert_eq!(clock.remaining(1_800, 3_000_000), 0, "never below nothing");
    }

    #[test]
    fn short_prompts_are_not_timed_and_samples_average() {
        let clock = PrefillClock::default();
        clock.sample(MIN_SAMPLE_TOKENS - 1, 0, 1_000);
        assert_eq!(clock.rate(), 0.0, "a short prompt's time is mostly overhead");
        clock.sample(1_000, 0, 1_000_000); // 1,000 tokens/s
        clock.sample(1_000, 0, 500_000); // 2,000 tokens/s: the average moves a fifth of the way
        assert!((clock.rate() - 1_200.0).abs() < 1e-9);
    }
}
