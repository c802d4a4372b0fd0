//! The prefix index: block hash → the endpoints holding that block, sharded under read-write locks so
//! that matching (reads) runs concurrently with event application (short writes, one block at a time),
//! bounded to `max_blocks` blocks with CLOCK eviction per shard.
//!
//! `PrefixIndex<Holders>` is the precise index fed by engine KV events; `PrefixIndex<Leases>` is the
//! approximate one, learned from the gateway's own routing decisions, each entry expiring after a TTL.
//!
//! Memory per cached block (precise, 64-bit): a 16-byte slot (hash, up to three holders inline, flag)
//! plus a 4-byte slot index and its control byte in the block table at hashbrown's 7/8 load (about
//! 6-11 bytes by growth phase), so 22-27 bytes; a block held by more than three endpoints adds its
//! spilled set (a 24-byte vector header, a 16-byte print, 2 bytes per holder: `holders.rs`);
//! `memory_bytes` reports the exact table sizes and `examples/routing_scale.rs` measures allocations.
//! The per-endpoint engine-hash maps of `engine_map.rs` come on top.

use std::sync::{RwLock, RwLockReadGuard};

use super::block_hash::BlockHash;
use super::endpoint_set::{EndpointId, EndpointSet};
use super::holders::{Holders, SetPrint};
use super::membership::{Leases, Membership, Tick};
use super::shard::Shard;

const SHARD_BITS: u32 = 4;
const SHARDS: usize = 1 << SHARD_BITS;

pub type EventIndex = PrefixIndex<Holders>;
pub type RoutedIndex = PrefixIndex<Leases>;

pub struct PrefixIndex<M: Membership> {
    shards: Box<[RwLock<Shard<M>>]>,
}

/// Per endpoint, how many leading blocks of the matched prompt it holds: the endpoints holding at least
/// the first block, ascending by id (every other candidate holds none).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MatchCounts {
    held: Vec<(EndpointId, u32)>,
}

impl MatchCounts {
    pub fn none() -> Self {
        MatchCounts::default()
    }
    pub fn get(&self, id: EndpointId) -> u32 {
        self.held
            .binary_search_by_key(&id, |&(e, _)| e)
            .map_or(0, |i| self.held[i].1)
    }
    /// `(endpoint, leading blocks held)` for every endpoint holding at least one, ascending by id.
    pub fn iter(&self) -> impl Iterator<Item = (EndpointId, u32)> + '_ {
        self.held.iter().copied()
    }
}

/// Blocks of a prompt looked up together (`match_prefix_where`).
const BATCH: usize = 8;

/// Past this many endpoints still matching, a block's holders are read whole and merged with them
/// instead of each being looked up in the block.
const LOOKUP_AT_MOST: usize = 16;

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
    /// Costs the first block's holders, then per block the fewer of those still matching (looked up)
    /// and the block's holders (merged), whatever the number of candidates.
    pub fn match_prefix(&self, hashes: &[BlockHash], candidates: &EndpointSet, now: Tick) -> MatchCounts {
        self.match_prefix_where(hashes, |id| candidates.contains(id), now)
    }

    /// `match_prefix` over the endpoints `is_candidate` admits (asked once per holder of the first
    /// block), for a caller that has no set of them at hand.
    pub fn match_prefix_where(
        &self,
        hashes: &[BlockHash],
        is_candidate: impl Fn(EndpointId) -> bool,
        now: Tick,
    ) -> MatchCounts {
        let mut held = Vec::new();
        // Candidates holding every block so far, ascending; `next`: those also holding this one.
        let mut alive: Vec<EndpointId> = Vec::new();
        let mut next: Vec<EndpointId> = Vec::new();
        // `alive`'s print, computed when `alive` changes while it is long enough to compare whole.
        let mut alive_print = None;
        let mut depth = 0;
        'walk: while depth < hashes.len() {
            // The first block alone (most prompts stop there), then a batch at a time: the read locks
            // of the shards it touches, taken in shard order (no lock-order cycle with a waiting
            // writer; writers hold one at a time), then its lookups back to back. They are independent
            // memory accesses whose cache misses overlap, where one block at a time waits for each in
            // turn: on a large index most of a long prompt's match is that wait.
            let batch = &hashes[depth..hashes.len().min(depth + if depth == 0 { 1 } else { BATCH })];
            let mut locked = [false; SHARDS];
            for &h in batch {
                locked[shard_of(h)] = true;
            }
            let shards: [Option<RwLockReadGuard<'_, Shard<M>>>; SHARDS] =
                std::array::from_fn(|s| locked[s].then(|| self.read(s)));
            let slots: Vec<_> = batch
                .iter()
                .map(|&h| {
                    let shard = shards[shard_of(h)].as_ref().expect("locked above");
                    let found = shard.get(h).map(|slot| (slot, shard.spill()));
                    if let Some((slot, spill)) = found {
                        slot.members.warm(spill);
                    }
                    found
                })
                .collect();
            for found in slots {
                next.clear();
                if let Some((slot, spill)) = found {
                    let print = (alive.len() > LOOKUP_AT_MOST)
                        .then(|| *alive_print.get_or_insert_with(|| SetPrint::of(alive.iter().copied())));
                    if print.is_some_and(|print| slot.members.holders_are(&alive, print, now, spill)) {
                        // Held by exactly those still matching (a shared prefix, typically): all go on.
                        slot.touch();
                        depth += 1;
                        continue;
                    }
                    if depth == 0 {
                        slot.members.live_into(now, spill, &mut next);
                        next.retain(|&id| is_candidate(id));
                    } else if alive.len() <= LOOKUP_AT_MOST {
                        next.extend(alive.iter().filter(|&&id| slot.members.holds(id, now, spill)));
                    } else {
                        slot.members.live_into(now, spill, &mut next);
                        retain_common(&mut next, &alive);
                    }
                    if !next.is_empty() {
                        slot.touch();
                    }
                }
                if depth > 0 {
                    // Those matching so far that miss this block hold `depth` leading blocks.
                    let mut j = 0;
                    for &id in &alive {
                        while j < next.len() && next[j] < id {
                            j += 1;
                        }
                        if next.get(j) != Some(&id) {
                            held.push((id, depth as u32));
                        }
                    }
                }
                std::mem::swap(&mut alive, &mut next);
                alive_print = None;
                if alive.is_empty() {
                    break 'walk;
                }
                depth += 1;
            }
        }
        held.extend(alive.iter().map(|&id| (id, hashes.len() as u32)));
        held.sort_unstable();
        MatchCounts { held }
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

/// Keeps the ids of `ids` that are also in `other` (both ascending).
fn retain_common(ids: &mut Vec<EndpointId>, other: &[EndpointId]) {
    let mut j = 0;
    ids.retain(|&id| {
        while j < other.len() && other[j] < id {
            j += 1;
        }
        other.get(j) == Some(&id)
    });
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
