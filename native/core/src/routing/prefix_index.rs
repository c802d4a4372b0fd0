//! The prefix index: block hash → the endpoints holding that block, sharded under read-write locks so
//! that matching (reads) runs concurrently with event application (short writes, one block at a time),
//! bounded to `max_blocks` blocks with CLOCK eviction per shard.
//!
//! `PrefixIndex<EndpointSet>` is the precise index fed by engine KV events; `PrefixIndex<Leases>` is the
//! approximate one, learned from the gateway's own routing decisions, each entry expiring after a TTL.
//!
//! Memory per cached block (precise, 64-bit): a 32-byte slot (hash, 128-bit endpoint set, flags) plus a
//! 16-byte map entry and its control byte at hashbrown's 7/8 load (about 19-38 bytes by growth phase),
//! so 51-70 bytes; `memory_bytes` reports the exact table sizes and `examples/routing_bench.rs`
//! measures allocations. The per-endpoint engine-hash maps of `engine_map.rs` come on top.

use std::sync::RwLock;

use super::block_hash::BlockHash;
use super::endpoint_set::{EndpointId, EndpointSet, MAX_ENDPOINTS};
use super::membership::{Leases, Membership, Tick};
use super::shard::Shard;

const SHARD_BITS: u32 = 4;
const SHARDS: usize = 1 << SHARD_BITS;

pub type EventIndex = PrefixIndex<EndpointSet>;
pub type RoutedIndex = PrefixIndex<Leases>;

pub struct PrefixIndex<M> {
    shards: Box<[RwLock<Shard<M>>]>,
}

/// Per endpoint, how many leading blocks of the matched prompt it holds.
#[derive(Clone)]
pub struct MatchCounts {
    counts: [u32; MAX_ENDPOINTS],
}

impl MatchCounts {
    pub fn none() -> Self {
        MatchCounts {
            counts: [0; MAX_ENDPOINTS],
        }
    }
    pub fn get(&self, id: EndpointId) -> u32 {
        self.counts.get(id).copied().unwrap_or(0)
    }
}

fn shard_of(hash: BlockHash) -> usize {
    (hash >> (64 - SHARD_BITS)) as usize
}

impl<M: Membership> PrefixIndex<M> {
    pub fn new(max_blocks: usize) -> Self {
        let per_shard = max_blocks.div_ceil(SHARDS).max(1);
        PrefixIndex {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::new(per_shard))).collect(),
        }
    }

    /// Records `id` as holding each block; returns how many blocks were evicted to make room.
    pub fn insert(&self, id: EndpointId, hashes: &[BlockHash], until: Tick) -> usize {
        if hashes.len() == 1 {
            return usize::from(self.write(shard_of(hashes[0])).add(hashes[0], id, until));
        }
        // One write lock per shard touched rather than one per block.
        let mut by_shard: Vec<(usize, BlockHash)> = hashes.iter().map(|&h| (shard_of(h), h)).collect();
        by_shard.sort_by_key(|&(s, _)| s);
        let mut evicted = 0;
        for group in by_shard.chunk_by(|a, b| a.0 == b.0) {
            let mut shard = self.write(group[0].0);
            for &(_, h) in group {
                evicted += usize::from(shard.add(h, id, until));
            }
        }
        evicted
    }

    pub fn remove(&self, id: EndpointId, hash: BlockHash) {
        self.write(shard_of(hash)).remove(hash, id);
    }

    /// Forgets everything `id` holds (one shard locked at a time).
    pub fn clear(&self, id: EndpointId) {
        for s in 0..SHARDS {
            self.write(s).clear(id);
        }
    }

    /// For each candidate, the number of leading blocks of `hashes` (a prompt's chain) it holds at
    /// `now`. Walks the chain until no candidate holds the next block; marks the held blocks used.
    pub fn match_prefix(&self, hashes: &[BlockHash], candidates: EndpointSet, now: Tick) -> MatchCounts {
        let mut out = MatchCounts::none();
        let mut alive = candidates;
        let mut depth = 0;
        for &h in hashes {
            if alive.is_empty() {
                break;
            }
            let held = {
                let shard = self.read(shard_of(h));
                match shard.get(h) {
                    Some(slot) => {
                        let held = slot.members.live(now).and(alive);
                        if !held.is_empty() {
                            slot.touch();
                        }
                        held
                    }
                    None => EndpointSet::EMPTY,
                }
            };
            for id in alive.and_not(held).iter() {
                out.counts[id] = depth;
            }
            alive = held;
            depth += 1;
        }
        for id in alive.iter() {
            out.counts[id] = depth;
        }
        out
    }

    /// Blocks in the index.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|s| self.read(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by the index's tables.
    pub fn memory_bytes(&self) -> usize {
        (0..SHARDS).map(|s| self.read(s).memory_bytes()).sum::<usize>() + std::mem::size_of::<Self>()
    }

    // A poisoned shard only means a panic elsewhere mid-update; its maps stay structurally valid.
    fn read(&self, s: usize) -> std::sync::RwLockReadGuard<'_, Shard<M>> {
        self.shards[s].read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self, s: usize) -> std::sync::RwLockWriteGuard<'_, Shard<M>> {
        self.shards[s].write().unwrap_or_else(|e| e.into_inner())
    }
}

impl PrefixIndex<Leases> {
    /// Approximate mode: the gateway sent a prompt with these block hashes to `id`; assume the engine
    /// holds them for `ttl` ticks from `now`.
    pub fn record_routed(&self, id: EndpointId, hashes: &[BlockHash], now: Tick, ttl: Tick) {
        self.insert(id, hashes, now.saturating_add(ttl));
    }
}

#[cfg(test)]
#[path = "prefix_index_tests.rs"]
mod tests;
