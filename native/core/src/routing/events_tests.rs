//! Event application: chains, removals through engine hashes, copies, Cleared, gaps, duplicates,
//! snapshots, loads, filters; and a property test against a model engine cache.

use std::collections::HashMap;

use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::pb::kv_events::{KvBlock, KvBlocksRemoved, KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch};
use crate::routing::block_hash::{prompt_hashes, root, ROOT};
use crate::routing::endpoint_set::EndpointSet;

const B: usize = 4;

fn toks(blocks: &[u32]) -> Vec<u32> {
    blocks.iter().flat_map(|&b| [b; B]).collect()
}

fn block(engine_hash: i64, token: u32) -> KvBlock {
    KvBlock {
        block_hash: engine_hash,
        token_ids: vec![token; B],
        block_size: B as i32,
        ..Default::default()
    }
}

fn stored(parent: Option<i64>, blocks: Vec<KvBlock>) -> KvCacheEvent {
    stored_with(KvBlocksStored {
        blocks,
        parent_block_hash: parent,
        ..Default::default()
    })
}

fn stored_with(s: KvBlocksStored) -> KvCacheEvent {
    KvCacheEvent {
        event_id: 1,
        data: Some(Data::Stored(s)),
    }
}

fn removed(hashes: &[i64]) -> KvCacheEvent {
    KvCacheEvent {
        event_id: 1,
        data: Some(Data::Removed(KvBlocksRemoved {
            block_hashes: hashes.to_vec(),
            ..Default::default()
        })),
    }
}

fn cleared() -> KvCacheEvent {
    KvCacheEvent {
        event_id: 0,
        data: Some(Data::Cleared(KvCacheCleared::default())),
    }
}

fn batch(seq: u64, events: Vec<KvCacheEvent>) -> KvEventBatch {
    KvEventBatch {
        sequence_number: seq,
        events,
        ..Default::default()
    }
}

struct Fixture {
    index: EventIndex,
    state: EventState,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            index: EventIndex::new(1 << 12),
            state: EventState::new(1 << 12),
        }
    }
    fn apply(&mut self, batch: &KvEventBatch) -> EventOutcome {
        self.state.apply_batch(&self.index, 0, batch, OnGap::Break).outcome
    }
    /// Leading blocks of the prompt made of these block tokens that endpoint 0 holds.
    fn held(&self, blocks: &[u32]) -> u32 {
        self.index
            .match_prefix(&prompt_hashes(&toks(blocks), B, ROOT), &EndpointSet::of([0]), 0)
            .get(0)
    }
}

#[test]
fn stored_chains_match_prompts() {
    let mut f = Fixture::new();
    let out = f.apply(&batch(1, vec![stored(None, vec![block(101, 1), block(102, 2)])]));
    assert!(
        matches!(
            out,
            EventOutcome::Applied(ApplyStats {
                stored: 2,
                block_size: Some(4),
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(f.held(&[1, 2, 3]), 2);
    // A later event continues the chain from the engine's parent hash.
    f.apply(&batch(2, vec![stored(Some(102), vec![block(103, 3)])]));
    assert_eq!(f.held(&[1, 2, 3]), 3);
    assert_eq!(
        f.held(&[2, 3]),
        0,
        "the same blocks at another position are another prefix"
    );
}

#[test]
fn unknown_parent_is_skipped_not_hashed_from_the_root() {
    let mut f = Fixture::new();
    let out = f.apply(&batch(1, vec![stored(Some(999), vec![block(103, 3)])]));
    assert!(
        matches!(
            out,
            EventOutcome::Applied(ApplyStats {
                stored: 0,
                skipped: 1,
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(f.held(&[3]), 0);
    assert!(f.index.is_empty());
}

#[test]
fn removed_names_engine_hashes() {
    let mut f = Fixture::new();
    f.apply(&batch(
        1,
        vec![stored(None, vec![block(-7, 1), block(8, 2), block(9, 3)])],
    ));
    let out = f.apply(&batch(2, vec![removed(&[8, 12345])]));
    assert!(
        matches!(
            out,
            EventOutcome::Applied(ApplyStats {
                removed: 1,
                skipped: 1,
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(f.held(&[1, 2, 3]), 1, "the prefix stops at the removed block");
}

#[test]
fn a_block_goes_with_its_last_copy() {
    let mut f = Fixture::new();
    f.apply(&batch(1, vec![stored(None, vec![block(5, 1)])]));
    f.apply(&batch(2, vec![stored(None, vec![block(5, 1)])]));
    f.apply(&batch(3, vec![removed(&[5])]));
    assert_eq!(f.held(&[1]), 1);
    f.apply(&batch(4, vec![removed(&[5])]));
    assert_eq!(f.held(&[1]), 0);
}

#[test]
fn cleared_forgets_everything_of_the_endpoint_only() {
    let mut f = Fixture::new();
    let mut other = EventState::new(100);
    other.apply_batch(
        &f.index,
        1,
        &batch(1, vec![stored(None, vec![block(5, 1)])]),
        OnGap::Break,
    );
    f.apply(&batch(1, vec![stored(None, vec![block(5, 1), block(6, 2)])]));
    let out = f.apply(&batch(2, vec![cleared()]));
    assert!(matches!(out, EventOutcome::Applied(ApplyStats { cleared: true, .. })));
    assert_eq!(f.held(&[1, 2]), 0);
    assert_eq!(f.state.engine_map().len(), 0);
    let h = prompt_hashes(&toks(&[1]), B, ROOT);
    assert_eq!(f.index.match_prefix(&h, &EndpointSet::of([1]), 0).get(1), 1);
}

#[test]
fn duplicates_are_not_applied_twice() {
    let mut f = Fixture::new();
    let b1 = batch(1, vec![stored(None, vec![block(5, 1)])]);
    f.apply(&b1);
    assert_eq!(f.apply(&b1), EventOutcome::Duplicate { seq: 1 });
    f.apply(&batch(2, vec![removed(&[5])]));
    assert_eq!(f.held(&[1]), 0, "a replayed Stored would have left a phantom copy");
}

#[test]
fn a_gap_clears_the_endpoint_until_reset() {
    let mut f = Fixture::new();
    f.apply(&batch(1, vec![stored(None, vec![block(5, 1)])]));
    let out = f.apply(&batch(3, vec![stored(Some(5), vec![block(6, 2)])]));
    assert_eq!(out, EventOutcome::Gap { expected: 2, got: 3 });
    assert!(out.needs_resync());
    assert_eq!(f.held(&[1]), 0, "after a gap the endpoint's state is unknown");
    assert_eq!(f.apply(&batch(4, vec![stored(None, vec![block(5, 1)])])).kind(), "gap");
    assert_eq!(f.held(&[1]), 0);
    f.state.reset(&f.index, 0);
    assert_eq!(
        f.apply(&batch(100, vec![stored(None, vec![block(5, 1)])])).kind(),
        "applied"
    );
    assert_eq!(f.held(&[1]), 1);
}

#[test]
fn a_snapshot_resyncs_the_endpoint() {
    let mut f = Fixture::new();
    f.apply(&batch(1, vec![stored(None, vec![block(5, 1)])]));
    f.state.reset(&f.index, 0);
    let chunk = |index, count| {
        Some(pb::KvSnapshotChunk {
            index,
            count,
            blocks: 2,
            unknown_before: 0,
        })
    };
    let c0 = KvEventBatch {
        sequence_number: 50,
        events: vec![cleared(), stored(None, vec![block(7, 7)])],
        snapshot: chunk(0, 2),
        ..Default::default()
    };
    let c1 = KvEventBatch {
        sequence_number: 51,
        events: vec![stored(Some(7), vec![block(8, 8)])],
        snapshot: chunk(1, 2),
        ..Default::default()
    };
    assert_eq!(f.apply(&c0).kind(), "applied");
    assert_eq!(f.apply(&c1).kind(), "applied");
    assert_eq!(
        f.apply(&batch(52, vec![stored(Some(8), vec![block(9, 9)])])).kind(),
        "applied"
    );
    assert_eq!(f.held(&[7, 8, 9]), 3);
    assert_eq!(f.held(&[1]), 0);
}

#[test]
fn loads_are_returned_and_load_only_batches_admit_nothing() {
    let mut f = Fixture::new();
    let load = pb::EngineLoad {
        running_requests: 3,
        waiting_requests: 2,
        token_usage: 0.5,
        max_running_requests: 8,
        ..Default::default()
    };
    let b = KvEventBatch {
        sequence_number: 1,
        events: vec![stored(None, vec![block(5, 1)])],
        load: Some(load),
        ..Default::default()
    };
    let r = f.state.apply_batch(&f.index, 0, &b, OnGap::Break);
    assert_eq!(
        r.load,
        Some(EngineLoad {
            running: 3,
            waiting: 2,
            kv_usage: 0.5,
            max_running: 8,
            waiting_uncached_tokens: 0,
        })
    );
    let heartbeat = KvEventBatch {
        sequence_number: 1,
        load: Some(pb::EngineLoad {
            load_only: true,
            running_requests: 0,
            ..load
        }),
        ..Default::default()
    };
    let r = f.state.apply_batch(&f.index, 0, &heartbeat, OnGap::Break);
    assert_eq!(r.outcome, EventOutcome::LoadOnly);
    assert_eq!(r.load.map(|l| l.running), Some(0));
    assert_eq!(
        f.apply(&batch(2, vec![])).kind(),
        "applied",
        "the heartbeat did not move the cursor"
    );
}

#[test]
fn only_local_device_full_attention_blocks_are_indexed() {
    let mut f = Fixture::new();
    let host = KvBlocksStored {
        blocks: vec![block(5, 1)],
        tier: Some(pb::KvCacheTier::Host as i32),
        ..Default::default()
    };
    let remote = KvBlocksStored {
        blocks: vec![block(5, 1)],
        locality: Some(pb::KvCacheLocality::Remote as i32),
        ..Default::default()
    };
    let window = KvBlocksStored {
        blocks: vec![block(5, 1)],
        group_idx: Some(1),
        kv_cache_spec_kind: Some("sliding_window".into()),
        ..Default::default()
    };
    f.apply(&batch(
        1,
        vec![stored_with(host), stored_with(remote), stored_with(window)],
    ));
    assert_eq!(f.held(&[1]), 0);
    let full = KvBlocksStored {
        blocks: vec![block(5, 1)],
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
        tier: Some(pb::KvCacheTier::Device as i32),
        ..Default::default()
    };
    f.apply(&batch(2, vec![stored_with(full)]));
    assert_eq!(f.held(&[1]), 1);
    // The sliding-window group evicts its copy of the same engine hash: the full block stays.
    let window_removed = KvBlocksRemoved {
        block_hashes: vec![5],
        group_idx: Some(1),
        ..Default::default()
    };
    f.apply(&batch(
        3,
        vec![KvCacheEvent {
            event_id: 1,
            data: Some(Data::Removed(window_removed)),
        }],
    ));
    assert_eq!(f.held(&[1]), 1);
}

#[test]
fn namespaces_and_multimodal_blocks_do_not_match_plain_text() {
    let mut f = Fixture::new();
    let lora = KvBlocksStored {
        blocks: vec![block(5, 1)],
        lora_name: Some("ad".into()),
        ..Default::default()
    };
    let mut mm_block = block(6, 2);
    mm_block.extra_keys.push(pb::KvBlockExtraKey {
        key: Some(Key::Multimodal(pb::KvMultimodalKey {
            identifier: "img".into(),
            offset: 0,
        })),
    });
    let mut lora_text_key = block(7, 3);
    lora_text_key.extra_keys.push(pb::KvBlockExtraKey {
        key: Some(Key::Text("ad".into())),
    });
    let lora2 = KvBlocksStored {
        blocks: vec![lora_text_key],
        lora_name: Some("ad".into()),
        ..Default::default()
    };
    f.apply(&batch(
        1,
        vec![stored_with(lora), stored(None, vec![mm_block]), stored_with(lora2)],
    ));
    assert_eq!(f.held(&[1]), 0);
    assert_eq!(f.held(&[2]), 0);
    let in_lora = |t: u32| prompt_hashes(&toks(&[t]), B, root(Some("ad"), None));
    assert_eq!(f.index.match_prefix(&in_lora(1), &EndpointSet::of([0]), 0).get(0), 1);
    assert_eq!(
        f.index.match_prefix(&in_lora(3), &EndpointSet::of([0]), 0).get(0),
        1,
        "the LoRA name key is the namespace"
    );
}

#[test]
fn decodes_bytes_serialized_by_the_real_protos() {
    // `common_pb2.KvEventBatch` from smg-grpc-proto, serialized by Python protobuf: a Stored event
    // (parent -5, blocks -123456789 [1,2,3,4] and 42 [5,6,7,8] with a multimodal key, tier DEVICE,
    // lora "ad"), a Removed (group 1), a Cleared, snapshot chunk 0 of 2, and a load record.
    let hex = "080711000000000000f83f1a410801123d0a1308ebe590c5ffffffffff0112040102030418040a15082a12040506\
               07081804320922070a03696d67100310fbffffffffffffffff0118015a0261641a1308021a0f0a0bebe590c5ffff\
               ffffff016328011a0c080322080a06656e67696e6520003a06100218052001422608031002186421000000000000\
               d03f3040400951000000000000e03f9101000000000000c03f";
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let b = KvEventBatch::decode(bytes.as_slice()).unwrap();
    assert_eq!((b.sequence_number, b.timestamp, b.dp_rank), (7, 1.5, Some(0)));
    let Some(Data::Stored(s)) = &b.events[0].data else {
        panic!("stored")
    };
    assert_eq!(s.parent_block_hash, Some(-5));
    assert_eq!(
        (s.blocks[0].block_hash, &s.blocks[0].token_ids, s.blocks[0].block_size),
        (-123456789, &vec![1, 2, 3, 4], 4)
    );
    assert_eq!(
        s.blocks[1].extra_keys[0].key,
        Some(Key::Multimodal(pb::KvMultimodalKey {
            identifier: "img".into(),
            offset: 3
        }))
    );
    assert_eq!(
        (s.tier, s.lora_name.as_deref()),
        (Some(pb::KvCacheTier::Device as i32), Some("ad"))
    );
    let Some(Data::Removed(r)) = &b.events[1].data else {
        panic!("removed")
    };
    assert_eq!(
        (r.block_hashes.as_slice(), r.group_idx),
        (&[-123456789, 99][..], Some(1))
    );
    assert_eq!(
        b.events[2].data,
        Some(Data::Cleared(KvCacheCleared {
            ownership: Some("engine".into())
        }))
    );
    assert_eq!(
        b.snapshot,
        Some(pb::KvSnapshotChunk {
            index: 0,
            count: 2,
            blocks: 5,
            unknown_before: 1
        })
    );
    let l = b.load.unwrap();
    assert_eq!(
        (
            l.running_requests,
            l.waiting_requests,
            l.token_usage,
            l.max_running_requests
        ),
        (3, 2, 0.25, 64)
    );
    assert_eq!(
        (l.waiting_uncached_tokens, l.active_token_usage, l.sample, l.load_only),
        (Some(100), Some(0.125), 9, false)
    );
}

/// A model engine: a prefix cache of paths (block sequences), each path with its engine hash.
#[derive(Default)]
struct ModelEngine {
    held: HashMap<Vec<u32>, i64>,
    next_hash: i64,
    seq: u64,
}

impl ModelEngine {
    /// Caches every block of `prompt`, publishing a Stored event per block it did not hold.
    fn store(&mut self, prompt: &[u32]) -> KvEventBatch {
        let mut events = Vec::new();
        for i in 0..prompt.len() {
            let path = prompt[..=i].to_vec();
            if self.held.contains_key(&path) {
                continue;
            }
            self.next_hash += 1;
            let parent = if i == 0 { None } else { Some(self.held[&prompt[..i]]) };
            self.held.insert(path, self.next_hash);
            events.push(stored(parent, vec![block(self.next_hash, prompt[i])]));
        }
        self.seq += 1;
        batch(self.seq, events)
    }

    /// Evicts the block at `prompt[..=i]` if held (engines evict by recency, leaving children behind).
    fn evict(&mut self, prompt: &[u32], i: usize) -> KvEventBatch {
        let path = prompt[..=i.min(prompt.len() - 1)].to_vec();
        let events = self.held.remove(&path).map(|h| vec![removed(&[h])]).unwrap_or_default();
        self.seq += 1;
        batch(self.seq, events)
    }

    fn leading(&self, prompt: &[u32]) -> u32 {
        (0..prompt.len())
            .take_while(|&i| self.held.contains_key(&prompt[..=i]))
            .count() as u32
    }
}

proptest! {
    #[test]
    fn the_index_tracks_a_model_engine(
        ops in proptest::collection::vec((any::<bool>(), proptest::collection::vec(0..3u32, 1..6), 0..6usize), 0..60),
        queries in proptest::collection::vec(proptest::collection::vec(0..3u32, 1..7), 1..6),
    ) {
        let mut f = Fixture::new();
        let mut engine = ModelEngine::default();
        for (store, prompt, i) in &ops {
            let bytes = if *store { engine.store(prompt) } else { engine.evict(prompt, *i) };
            prop_assert_eq!(f.apply(&bytes).kind(), "applied");
        }
        for q in &queries {
            // A child stored while its parent was evicted is found again once the parent returns.
            prop_assert_eq!(f.held(q), engine.leading(q), "query {:?}", q);
        }
    }
}
