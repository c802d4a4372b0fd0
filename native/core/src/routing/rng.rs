//! A lock-free pseudo-random source shared by all threads: splitmix64 over an atomic counter. Policies
//! need cheap, well-spread draws (random picks, power-of-two samples, tie breaks), not secrecy;
//! a fixed seed makes tests and benchmarks repeatable.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Rng(AtomicU64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(AtomicU64::new(seed))
    }

    pub fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift (bias below 2^-32 for the n we see).
    pub fn below(&self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_is_in_range_and_spread() {
        let rng = Rng::new(1);
        let mut counts = [0u32; 5];
        for _ in 0..50_000 {
            counts[rng.below(5)] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)), "{counts:?}");
    }
}
