//! A lock-free pseudo-random source shared by all threads: splitmix64 over an atomic counter. Policies
//! need cheap, well-spread draws (random picks, power-of-two samples, tie breaks), not secrecy;
//! a fixed seed makes tests and benchmarks repeatable.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Rng(AtomicU64);

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(AtomicU64::new(seed))
    }

    pub fn next_u64(&self) -> u64 {
        mix(self.0.fetch_add(GAMMA, Ordering::Relaxed).wrapping_add(GAMMA))
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift (bias below 2^-32 for the n we see).
    pub fn below(&self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// `n` draws taken at once (one atomic add), each computed only when asked for: `get(i)` is what
    /// the `i`-th of `n` successive `next_u64` calls would have returned had no other thread drawn
    /// meanwhile. A ranking that needs a tie break for few of its candidates pays for those only.
    pub fn reserve(&self, n: usize) -> Draws {
        Draws(self.0.fetch_add(GAMMA.wrapping_mul(n as u64), Ordering::Relaxed))
    }
}

/// Draws reserved by `Rng::reserve`.
#[derive(Clone, Copy, Debug)]
pub struct Draws(u64);

impl Draws {
    pub fn get(&self, i: usize) -> u64 {
        mix(self.0.wrapping_add(GAMMA.wrapping_mul(i as u64 + 1)))
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

    #[test]
    fn reserved_draws_are_the_successive_ones() {
        let (a, b) = (Rng::new(5), Rng::new(5));
        let drawn: Vec<u64> = (0..10).map(|_| a.next_u64()).collect();
        let reserved = b.reserve(10);
        assert_eq!((0..10).map(|i| reserved.get(i)).collect::<Vec<_>>(), drawn);
        assert_eq!(a.next_u64(), b.next_u64(), "both sources moved on alike");
    }
}
