//! One shard of the prefix index: a map from block hash to a slot, the slots, and a CLOCK hand that
//! evicts the least recently used block (approximately: a block matched or stored again since the hand
//! last passed it survives one more round; a block stored once and never used goes first) when the
//! shard is full. Readers mark use through an atomic flag
//! under the shard's read lock; only inserts and removals take the write lock.

use std::sync::atomic::{AtomicBool, Ordering};

use hashbrown::HashTable;

use super::block_hash::BlockHash;
use super::endpoint_set::EndpointId;
use super::membership::{Membership, Tick};
use super::mix_hash::mix64;

pub(crate) struct Slot<M> {
    pub hash: BlockHash,
    pub members: M,
    referenced: AtomicBool,
}

impl<M: Membership> Slot<M> {
    /// Marks the block used; a plain load first keeps the cache line shared when it already is.
    pub fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }

    /// An occupied slot always has a member: a block goes when its last holder does.
    fn occupied(&self) -> bool {
        !self.members.is_empty()
    }
}

pub(crate) struct Shard<M: Membership> {
    /// Slot indices, hashed by their slot's block hash (the hash is stored once, in the slot).
    map: HashTable<u32>,
    slots: Vec<Slot<M>>,
    free: Vec<u32>,
    spill: M::Spill,
    hand: usize,
    capacity: usize,
}

impl<M: Membership> Shard<M> {
    pub fn new(capacity: usize) -> Self {
        Shard {
            map: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            spill: M::Spill::default(),
            hand: 0,
            capacity: capacity.max(1),
        }
    }

    fn find(&self, hash: BlockHash) -> Option<usize> {
        let slots = &self.slots;
        self.map
            .find(mix64(hash), |&i| slots[i as usize].hash == hash)
            .map(|&i| i as usize)
    }

    pub fn get(&self, hash: BlockHash) -> Option<&Slot<M>> {
        self.find(hash).map(|i| &self.slots[i])
    }

    /// Where the slots' members keep what outgrew them.
    pub fn spill(&self) -> &M::Spill {
        &self.spill
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Records `id` as holding `hash`, evicting another block when the shard is full.
    /// Returns whether a block was evicted.
    pub fn add(&mut self, hash: BlockHash, id: EndpointId, until: Tick) -> bool {
        if let Some(i) = self.find(hash) {
            let slot = &mut self.slots[i];
            slot.members.add(id, until, &mut self.spill);
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
            });
            self.slots.len() - 1
        } else {
            evicted = true;
            self.evict()
        };
        let slot = &mut self.slots[index];
        slot.hash = hash;
        slot.members.add(id, until, &mut self.spill);
        // A new block starts unreferenced: one stored and never used again goes before blocks in use.
        *slot.referenced.get_mut() = false;
        let slots = &self.slots;
        self.map
            .insert_unique(mix64(hash), index as u32, |&i| mix64(slots[i as usize].hash));
        evicted
    }

    /// `id` no longer holds `hash`; the block goes when nobody does.
    pub fn remove(&mut self, hash: BlockHash, id: EndpointId) {
        if let Some(i) = self.find(hash) {
            let slot = &mut self.slots[i];
            slot.members.remove(id, &mut self.spill);
            if slot.members.is_empty() {
                self.release(i);
            }
        }
    }

    /// Drops `id` from every block: O(slots), for Cleared events and removed endpoints.
    pub fn clear(&mut self, id: EndpointId) {
        for i in 0..self.slots.len() {
            if self.slots[i].occupied() {
                self.slots[i].members.remove(id, &mut self.spill);
                if self.slots[i].members.is_empty() {
                    self.release(i);
                }
            }
        }
    }

    fn release(&mut self, i: usize) {
        let hash = self.slots[i].hash;
        if let Ok(entry) = self.map.find_entry(mix64(hash), |&j| j as usize == i) {
            entry.remove();
        }
        self.slots[i].members.release(&mut self.spill);
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
            if !slot.occupied() {
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

    /// Bytes held by this shard's tables.
    pub fn memory_bytes(&self) -> usize {
        self.map.allocation_size()
            + self.slots.capacity() * std::mem::size_of::<Slot<M>>()
            + self.free.capacity() * std::mem::size_of::<u32>()
            + M::spill_bytes(&self.spill)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::holders::Holders;

    #[test]
    fn a_precise_slot_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Slot<Holders>>(), 16);
    }
}
