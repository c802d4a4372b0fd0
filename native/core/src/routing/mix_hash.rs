//! A hasher for maps keyed by one 64-bit integer: the murmur3 finalizer, a few cycles instead of
//! SipHash's dozens. Our block hashes are already uniform; engine block hashes may not be (a simulator
//! can number its blocks), and the index shards on the top bits, so every key is mixed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct MixHasher(u64);

/// The murmur3 64-bit finalizer: every input bit affects every output bit.
pub fn mix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        mix64(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }

    fn write_i64(&mut self, n: i64) {
        self.0 ^= n as u64;
    }
}

pub type MixMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_keys_spread_over_low_and_high_bits() {
        let b = BuildHasherDefault::<MixHasher>::default();
        let low: std::collections::HashSet<u64> = (0..1024u64).map(|k| b.hash_one(k) & 1023).collect();
        let high: std::collections::HashSet<u64> = (0..1024u64).map(|k| b.hash_one(k) >> 54).collect();
        assert!(low.len() > 600 && high.len() > 600, "{} {}", low.len(), high.len());
    }
}
