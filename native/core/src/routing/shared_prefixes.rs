//! Which cached prefixes requests share: the last block of a request's longest cached prefix, remembered
//! for a while. A block that ended another request's longest cached prefix recently is the end of a
//! prefix several requests start with (a system prompt, a document, a tool preamble); a follow-up turn's
//! longest cached prefix ends inside its own history, a block no other request ends at. The affinity
//! policies read the difference (`idle_uncached_weight`, `policy/affinity.rs`).
//!
//! A fixed table of slots, one atomic word each (a block's slot by its hash's low bits, a 32-bit tag
//! from its high bits beside the tick it was last seen): no lock on the pick path, a fixed size. Two
//! blocks in one slot evict each other (the older is forgotten: read as not shared), and a foreign block
//! matches a tag with odds of 2^-32.

use std::sync::atomic::{AtomicU64, Ordering};

use super::block_hash::BlockHash;
use super::membership::Tick;

/// Slots in the table: 64 KiB.
const SLOTS: usize = 1 << 13;

pub struct SharedPrefixes {
    slots: Box<[AtomicU64]>,
    /// How long a block stays remembered, in ticks.
    window: Tick,
}

impl SharedPrefixes {
    pub fn new(window: Tick) -> Self {
        SharedPrefixes {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            window,
        }
    }

    fn slot(&self, block: BlockHash) -> &AtomicU64 {
        &self.slots[block as usize & (SLOTS - 1)]
    }

    /// Whether `block` ended a request's longest cached prefix within the window before `now`.
    pub fn is_shared(&self, block: BlockHash, now: Tick) -> bool {
        let word = self.slot(block).load(Ordering::Relaxed);
        let (tag, seen) = ((word >> 32) as u32, word as u32);
        word != 0 && tag == (block >> 32) as u32 && now.wrapping_sub(seen) <= self.window
    }

    /// `block` ended a request's longest cached prefix at `now`.
    pub fn note(&self, block: BlockHash, now: Tick) {
        let word = ((block >> 32) << 32) | u64::from(now);
        self.slot(block).store(word.max(1), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_shared_once_another_request_ended_there_within_the_window() {
        let s = SharedPrefixes::new(100);
        let block: BlockHash = 0xdead_beef_0000_0042;
        assert!(!s.is_shared(block, 5), "never seen");
        s.note(block, 5);
        assert!(s.is_shared(block, 5));
        assert!(s.is_shared(block, 105), "at the window's end");
        assert!(!s.is_shared(block, 106), "past it");
        s.note(block, 200);
        assert!(s.is_shared(block, 250), "seen again");
    }

    #[test]
    fn blocks_sharing_a_slot_are_told_apart_by_their_tags() {
        let s = SharedPrefixes::new(100);
        let (a, b): (BlockHash, BlockHash) = (0x1111_0000_0000_0007, 0x2222_0000_0000_0007);
        s.note(a, 1);
        assert!(!s.is_shared(b, 1), "same slot, other tag");
        s.note(b, 2);
        assert!(s.is_shared(b, 2));
        assert!(!s.is_shared(a, 2), "evicted by b: forgotten, so read as not shared");
    }
}
