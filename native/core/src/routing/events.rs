//! Applies one endpoint's KV-event batches (protobuf bytes, `smg.grpc.common.KvEventBatch`) to the
//! precise prefix index.
//!
//! - Stored: each block's chain hash is computed from its token ids and its parent's hash (looked up
//!   through the engine-hash map, or the namespace root when the event names no parent). Blocks whose
//!   parent we do not know are skipped: hashing them from the root would claim prefixes nobody holds.
//! - Removed: engine hashes are mapped back to ours; the endpoint drops a block with its last copy.
//! - Cleared (and chunk 0 of a snapshot, which begins with one): the endpoint holds nothing.
//! - Only blocks a later request on this engine can hit are indexed: device tier, local, full attention.
//!   Events of other tiers, remote pools, and sliding-window or state groups are skipped.
//! - A sequence gap clears the endpoint and breaks the cursor until `reset`; the caller resubscribes.

use super::block_hash::{self, BlockHash};
use super::cursor::{Admit, Cursor};
use super::endpoint_set::EndpointId;
use super::engine_map::EngineMap;
use super::load::EngineLoad;
use super::prefix_index::EventIndex;
use crate::pb::kv_events::{self as pb, kv_block_extra_key::Key, kv_cache_event::Data};

/// What applying a batch did; `kind()` names it for the Python side.
#[derive(Clone, Debug, PartialEq)]
pub enum EventOutcome {
    Applied(ApplyStats),
    /// A load record without events.
    LoadOnly,
    /// Already applied (or older); ignored.
    Duplicate {
        seq: u64,
    },
    /// Batches were lost: the endpoint was cleared; reset and resubscribe from 0.
    Gap {
        expected: u64,
        got: u64,
    },
    /// Not a `KvEventBatch`; resubscribe.
    Malformed(String),
    /// The router has no endpoint of that address (not yet, or no longer, configured).
    UnknownEndpoint,
}

impl EventOutcome {
    pub fn kind(&self) -> &'static str {
        match self {
            EventOutcome::Applied(_) => "applied",
            EventOutcome::LoadOnly => "load_only",
            EventOutcome::Duplicate { .. } => "duplicate",
            EventOutcome::Gap { .. } => "gap",
            EventOutcome::Malformed(_) => "malformed",
            EventOutcome::UnknownEndpoint => "unknown_endpoint",
        }
    }

    /// The subscription must be torn down, the endpoint reset, and a new one started from 0.
    pub fn needs_resync(&self) -> bool {
        matches!(
            self,
            EventOutcome::Gap { .. } | EventOutcome::Malformed(_) | EventOutcome::UnknownEndpoint
        )
    }
}

/// What a sequence gap does to the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnGap {
    /// Clear it and admit nothing until `reset` (a gRPC stream: resubscribe from 0).
    Break,
    /// Leave it as it was, the batch unapplied: the caller offers the missing batches in order (vLLM's
    /// ZMQ replay) and then this one again, or calls `reset`.
    Hold,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApplyStats {
    pub seq: u64,
    /// Blocks the endpoint now holds that it did not before the batch (copies counted).
    pub stored: u32,
    /// Blocks the endpoint no longer holds.
    pub removed: u32,
    pub cleared: bool,
    /// Blocks not indexed: other tier or group, unknown parent or engine hash, no token ids.
    pub skipped: u32,
    /// Tokens per block the engine stores, as seen in this batch.
    pub block_size: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BatchResult {
    pub outcome: EventOutcome,
    /// The engine's load record carried by the batch, whatever the outcome (except malformed).
    pub load: Option<EngineLoad>,
}

/// The event-stream state of one endpoint.
pub struct EventState {
    cursor: Cursor,
    engine: EngineMap,
    /// KV-cache groups that are not full attention (learned from Stored events): their removals
    /// name the same engine hashes as the full-attention group's blocks and must not touch them.
    excluded_groups: Vec<u32>,
    /// Whether any batch was ever admitted: the endpoint publishes events.
    pub publishing: bool,
}

impl EventState {
    pub fn new(max_engine_blocks: usize) -> Self {
        EventState {
            cursor: Cursor::Fresh,
            engine: EngineMap::new(max_engine_blocks),
            excluded_groups: Vec::new(),
            publishing: false,
        }
    }

    /// Forget the endpoint's blocks and accept the first batch of a new subscription.
    pub fn reset(&mut self, index: &EventIndex, id: EndpointId) {
        self.cursor = Cursor::Fresh;
        self.engine.clear();
        index.clear(id);
    }

    pub fn engine_map(&self) -> &EngineMap {
        &self.engine
    }

    /// Applies one decoded batch for endpoint `id` (either channel's), a gap handled per `on_gap`.
    pub fn apply_batch(
        &mut self,
        index: &EventIndex,
        id: EndpointId,
        batch: &pb::KvEventBatch,
        on_gap: OnGap,
    ) -> BatchResult {
        let before = self.cursor;
        let load = batch.load.as_ref().map(EngineLoad::from);
        let load_only = batch.events.is_empty() && batch.load.as_ref().is_some_and(|l| l.load_only);
        let seq = batch.sequence_number;
        let outcome = match self.cursor.admit(seq, load_only, batch.snapshot.as_ref()) {
            Admit::LoadOnly => EventOutcome::LoadOnly,
            Admit::Duplicate => EventOutcome::Duplicate { seq },
            Admit::Gap { expected, got } if on_gap == OnGap::Hold => {
                self.cursor = before;
                EventOutcome::Gap { expected, got }
            }
            Admit::Gap { expected, got } => {
                self.engine.clear();
                index.clear(id);
                EventOutcome::Gap { expected, got }
            }
            Admit::Apply => {
                self.publishing = true;
                let mut stats = ApplyStats {
                    seq,
                    ..Default::default()
                };
                for event in &batch.events {
                    match &event.data {
                        Some(Data::Stored(s)) => self.stored(index, id, s, &mut stats),
                        Some(Data::Removed(r)) => self.removed(index, id, r, &mut stats),
                        Some(Data::Cleared(_)) => {
                            self.engine.clear();
                            index.clear(id);
                            stats.cleared = true;
                        }
                        None => {}
                    }
                }
                EventOutcome::Applied(stats)
            }
        };
        BatchResult { outcome, load }
    }

    fn stored(&mut self, index: &EventIndex, id: EndpointId, s: &pb::KvBlocksStored, stats: &mut ApplyStats) {
        if !full_attention(s) {
            if let Some(g) = s.group_idx.filter(|g| !self.excluded_groups.contains(g)) {
                self.excluded_groups.push(g);
            }
            stats.skipped += s.blocks.len() as u32;
            return;
        }
        if !on_device(s.tier, s.locality) {
            stats.skipped += s.blocks.len() as u32;
            return;
        }
        let lora = s.lora_name.as_deref();
        let salt = s.cache_salt.as_deref();
        let mut parent = match s.parent_block_hash {
            None => block_hash::root(lora, salt),
            Some(p) => match self.engine.get(p) {
                Some(h) => h,
                None => {
                    stats.skipped += s.blocks.len() as u32;
                    return;
                }
            },
        };
        let mut hashes: Vec<BlockHash> = Vec::with_capacity(s.blocks.len());
        for (i, block) in s.blocks.iter().enumerate() {
            if block.token_ids.is_empty() || block.cache_level.is_some_and(|l| l != 0) {
                // The rest of the chain hangs off this block: none of it can be placed.
                stats.skipped += (s.blocks.len() - i) as u32;
                break;
            }
            let mut h = block_hash::next(parent, &block.token_ids);
            for key in &block.extra_keys {
                if let Some(bytes) = extra_key_bytes(key.key.as_ref(), lora, salt) {
                    h = block_hash::with_extra(h, &bytes);
                }
            }
            if self.engine.get(block.block_hash).is_none() {
                stats.stored += 1;
            }
            self.engine.stored(block.block_hash, h);
            stats.block_size = Some(block.token_ids.len() as u32);
            hashes.push(h);
            parent = h;
        }
        index.insert(id, &hashes, 0);
    }

    fn removed(&mut self, index: &EventIndex, id: EndpointId, r: &pb::KvBlocksRemoved, stats: &mut ApplyStats) {
        let excluded = r.group_idx.is_some_and(|g| self.excluded_groups.contains(&g));
        if excluded || !on_device(r.tier, r.locality) || r.cache_level.is_some_and(|l| l != 0) {
            stats.skipped += r.block_hashes.len() as u32;
            return;
        }
        for &eh in &r.block_hashes {
            match self.engine.removed(eh) {
                Some(h) => {
                    index.remove(id, h);
                    stats.removed += 1;
                }
                None if self.engine.get(eh).is_some() => {} // another copy remains
                None => stats.skipped += 1,
            }
        }
    }
}

fn on_device(tier: Option<i32>, locality: Option<i32>) -> bool {
    let tier_ok = matches!(
        tier.map(pb::KvCacheTier::try_from),
        None | Some(Ok(pb::KvCacheTier::Unspecified | pb::KvCacheTier::Device))
    );
    let local = !matches!(
        locality.map(pb::KvCacheLocality::try_from),
        Some(Ok(pb::KvCacheLocality::Remote))
    );
    tier_ok && local
}

/// Sliding-window, chunked-local and state-space groups do not hold a reusable prefix.
fn full_attention(s: &pb::KvBlocksStored) -> bool {
    if s.kv_cache_spec_sliding_window.is_some_and(|w| w > 0) {
        return false;
    }
    let kind = s.kv_cache_spec_kind.as_deref().unwrap_or("").to_ascii_lowercase();
    !["sliding", "window", "local", "mamba", "state"]
        .iter()
        .any(|k| kind.contains(k))
}

/// The bytes an extra key folds into a block's hash; `None` for the namespace (LoRA name, cache salt),
/// which the chain's root already carries.
fn extra_key_bytes(key: Option<&Key>, lora: Option<&str>, salt: Option<&str>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match key? {
        Key::Text(t) if Some(t.as_str()) == lora || Some(t.as_str()) == salt => return None,
        Key::Text(t) => {
            out.push(1);
            out.extend_from_slice(t.as_bytes());
        }
        Key::Blob(b) => {
            out.push(2);
            out.extend_from_slice(b);
        }
        Key::Number(n) => {
            out.push(3);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Key::Multimodal(m) => {
            out.push(4);
            out.extend_from_slice(&(m.identifier.len() as u64).to_le_bytes());
            out.extend_from_slice(m.identifier.as_bytes());
            out.extend_from_slice(&m.offset.to_le_bytes());
        }
    }
    Some(out)
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
