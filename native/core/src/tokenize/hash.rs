//! Fast non-cryptographic hashing for the tokenizer's tables and caches.
//!
//! The vocabulary and merge tables are probed once or more per token, so SipHash (std's default,
//! DoS-resistant) would cost more than the lookups themselves. Keys here come from model files, not
//! clients; cache keys are verified by comparing the text, so a collision costs time, never a result.

use std::hash::{BuildHasherDefault, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Word-at-a-time multiply-rotate hasher (the FxHash construction).
#[derive(Default, Clone, Copy)]
pub struct FastHasher {
    state: u64,
}

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_u128(&mut self, i: u128) {
        self.add(i as u64);
        self.add((i >> 64) as u64);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits weakest; hash tables index buckets with them.
        self.state.rotate_left(26)
    }
}

pub type FastBuild = BuildHasherDefault<FastHasher>;
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastBuild>;

/// For keys that already are good 64-bit hashes (the caches' prefix hashes).
#[derive(Default, Clone, Copy)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = i;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub type HashedMap<V> = std::collections::HashMap<u64, V, BuildHasherDefault<IdentityHasher>>;

/// Hashes of a text's prefixes, computed in one left-to-right pass.
///
/// `at(end)` must be called with non-decreasing `end`; the hash of `text[..end]` depends only on
/// those bytes, so two texts sharing a prefix get the same hash for it.
pub struct PrefixHasher<'a> {
    bytes: &'a [u8],
    words: usize,
    state: u64,
}

impl<'a> PrefixHasher<'a> {
    pub fn new(text: &'a str) -> Self {
        PrefixHasher {
            bytes: text.as_bytes(),
            words: 0,
            state: 0x243F_6A88_85A3_08D3,
        }
    }

    pub fn at(&mut self, end: usize) -> u64 {
        let full_words = end / 8;
        while self.words < full_words {
            let at = self.words * 8;
            let word = u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes"));
            self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(K);
            self.words += 1;
        }
        let mut tail = [0u8; 8];
        let rest = &self.bytes[full_words * 8..end];
        tail[..rest.len()].copy_from_slice(rest);
        let mixed = (self.state.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
        // Final avalanche so that nearby lengths do not collide in the table's low bits.
        let mut h = mixed ^ (end as u64).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        h ^= h >> 33;
        h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        h ^ (h >> 33)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_hashes_depend_only_on_the_prefix() {
        let a = "<|start|>user<|end|>hello there, a longer text";
        let b = "<|start|>user<|end|>hello there, something else entirely";
        let (mut ha, mut hb) = (PrefixHasher::new(a), PrefixHasher::new(b));
        for end in [0, 9, 13, 20, 27] {
            assert_eq!(ha.at(end), hb.at(end), "prefix of {end} bytes");
        }
        assert_ne!(ha.at(a.len()), hb.at(b.len()));
        assert_ne!(PrefixHasher::new("ab").at(1), PrefixHasher::new("ab").at(2));
    }
}
