//! One shard of the prefix index: a map from block hash to a slot, the slots, and a CLOCK hand that
//! evicts the least recently used block (approximately: a block matched or stored again since the hand
//! last passed it survives one more round; a block stored once and never used goes first) when the
//! shard is full. Readers mark use through an atomic flag
//! under the shard's read lock; only inserts and removals take the write lock.

use std::sync::atomic::{AtomicBool, Ordering};

use super::block_hash::BlockHash;
use super::endpoint_set::EndpointId;
use super::membership::{Membership, Tick};
use super::mix_hash::MixMap;

pub(crate) struct Slot<M> {
    pub hash: BlockHash,
    pub members: M,
    referenced: AtomicBool,
    occupied: bool,
}

impl<M: Membership> Slot<M> {
    /// Marks the block used; a plain load first keeps the cache line shared when it already is.
    pub fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}

pub(crate) struct Shard<M> {
    map: MixMap<BlockHash, u32>,
    slots: Vec<Slot<M>>,
    free: Vec<u32>,
    hand: usize,
    capacity: usize,
}

impl<M: Membership> Shard<M> {
    pub fn new(capacity: usize) -> Self {
        Shard {
            map: MixMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            hand: 0,
            capacity: capacity.max(1),
        }
    }

    pub fn get(&self, hash: BlockHash) -> Option<&Slot<M>> {
        self.map.get(&hash).map(|&i| &self.slots[i as usize])
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Records `id` as holding `hash`, evicting another block when the shard is full.
    /// Returns whether a block was evicted.
    pub fn add(&mut self, hash: BlockHash, id: EndpointId, until: Tick) -> bool {
        if let Some(&i) = self.map.get(&hash) {
            let slot = &mut self.slots[i as usize];
            slot.members.add(id, until);
            *slot.referenced.get_mut() = true;
            return false;
        }
        let mut evicted = false;
        let index = if let Some(i) = self.free.pop() {
            i as usize
        } else if self.slots.len() < self.capacity {
            self.slots.push(Slot {
                hash: 0,
                members: M::default(),
                referenced: AtomicBool::new(false),
                occupied: false,
            });
            self.slots.len() - 1
        } else {
            evicted = true;
            self.evict()
        };
        let slot = &mut self.slots[index];
        slot.hash = hash;
        slot.members = M::default();
        slot.members.add(id, until);
        // A new block starts unreferenced: one stored and never used again goes before blocks in use.
        *slot.referenced.get_mut() = false;
        slot.occupied = true;
        self.map.insert(hash, index as u32);
        evicted
    }

    /// `id` no longer holds `hash`; the block goes when nobody does.
    pub fn remove(&mut self, hash: BlockHash, id: EndpointId) {
        if let Some(&i) = self.map.get(&hash) {
            let slot = &mut self.slots[i as usize];
            slot.members.remove(id);
            if slot.members.is_empty() {
                self.release(i as usize);
            }
        }
    }

    /// Drops `id` from every block: O(slots), for Cleared events and removed endpoints.
    pub fn clear(&mut self, id: EndpointId) {
        for i in 0..self.slots.len() {
            if self.slots[i].occupied {
                self.slots[i].members.remove(id);
                if self.slots[i].members.is_empty() {
                    self.release(i);
                }
            }
        }
    }

    fn release(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        self.map.remove(&slot.hash);
        slot.occupied = false;
        slot.members = M::default();
        self.free.push(i as u32);
    }

    /// CLOCK: clears reference flags until it finds an unreferenced block, frees it, returns its slot.
    /// Within two sweeps it always finds one (the first sweep clears every flag it passes).
    fn evict(&mut self) -> usize {
        let n = self.slots.len();
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % n;
            let slot = &mut self.slots[i];
            if !slot.occupied {
                continue;
            }
            if std::mem::take(slot.referenced.get_mut()) {
                continue;
            }
            self.release(i);
            self.free.pop();
            return i;
        }
    }

    /// Bytes held by this shard's tables (hashbrown: one control byte per bucket, buckets a power of
    /// two at most 8/7 of the capacity).
    pub fn memory_bytes(&self) -> usize {
        let buckets = if self.map.capacity() == 0 {
            0
        } else {
            (self.map.capacity() * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(BlockHash, u32)>() + 1)
            + self.slots.capacity() * std::mem::size_of::<Slot<M>>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}
