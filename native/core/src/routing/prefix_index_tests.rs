//! Unit and property tests of the prefix index against a naive model.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::routing::block_hash::{prompt_hashes, ROOT};

const B: usize = 4;

/// A prompt made of blocks drawn from a small alphabet, so that prompts share prefixes often.
fn chain(blocks: &[u8]) -> Vec<BlockHash> {
    let tokens: Vec<u32> = blocks.iter().flat_map(|&b| [u32::from(b); B]).collect();
    prompt_hashes(&tokens, B, ROOT)
}

fn all(n: usize) -> EndpointSet {
    EndpointSet::of(0..n)
}

/// The endpoints of the property tests: low and high ids (up to the largest), six so that some blocks
/// have more holders than fit inline.
const IDS: [EndpointId; 6] = [0, 1, 200, 4_095, 9_999, 65_534];

#[derive(Default)]
struct Naive {
    held: HashMap<BlockHash, BTreeSet<EndpointId>>,
}

impl Naive {
    fn insert(&mut self, id: EndpointId, hashes: &[BlockHash]) {
        for &h in hashes {
            self.held.entry(h).or_default().insert(id);
        }
    }
    fn remove(&mut self, id: EndpointId, h: BlockHash) {
        if let Some(s) = self.held.get_mut(&h) {
            s.remove(&id);
            if s.is_empty() {
                self.held.remove(&h);
            }
        }
    }
    fn clear(&mut self, id: EndpointId) {
        let keys: Vec<_> = self.held.keys().copied().collect();
        for h in keys {
            self.remove(id, h);
        }
    }
    fn count(&self, id: EndpointId, hashes: &[BlockHash]) -> u32 {
        hashes
            .iter()
            .take_while(|h| self.held.get(h).is_some_and(|s| s.contains(&id)))
            .count() as u32
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(EndpointId, Vec<u8>),
    Remove(EndpointId, Vec<u8>, usize),
    Clear(EndpointId),
}

fn op() -> impl Strategy<Value = Op> {
    let id = proptest::sample::select(IDS.to_vec());
    let prompt = proptest::collection::vec(0..4u8, 1..7);
    prop_oneof![
        6 => (id.clone(), prompt.clone()).prop_map(|(i, p)| Op::Insert(i, p)),
        3 => (id.clone(), prompt, 0..6usize).prop_map(|(i, p, k)| Op::Remove(i, p, k)),
        1 => id.prop_map(Op::Clear),
    ]
}

fn apply(index: &EventIndex, naive: &mut Naive, op: &Op) {
    match op {
        Op::Insert(id, p) => {
            index.insert(*id, &chain(p), 0);
            naive.insert(*id, &chain(p));
        }
        Op::Remove(id, p, k) => {
            let c = chain(p);
            let h = c[k % c.len()];
            index.remove(*id, h);
            naive.remove(*id, h);
        }
        Op::Clear(id) => {
            index.clear(*id);
            naive.clear(*id);
        }
    }
}

/// An index and the naive model after the same `ops`, nothing evicted.
fn filled(ops: &[Op]) -> (EventIndex, Naive) {
    let index = EventIndex::new(1 << 16);
    let mut naive = Naive::default();
    for op in ops {
        apply(&index, &mut naive, op);
    }
    (index, naive)
}

/// Every query's match over `ids` gives each endpoint the naive model's count.
fn matches_agree(
    index: &EventIndex,
    naive: &Naive,
    queries: &[Vec<u8>],
    ids: &[EndpointId],
) -> Result<(), TestCaseError> {
    for q in queries {
        let hashes = chain(q);
        let got = index.match_prefix(&hashes, &EndpointSet::of(ids.iter().copied()), 0);
        for &id in ids {
            prop_assert_eq!(got.get(id), naive.count(id, &hashes), "endpoint {} query {:?}", id, q);
        }
    }
    Ok(())
}

/// The crowded property test's endpoints: forty, spread over the id range.
fn crowd() -> Vec<EndpointId> {
    (0..40).map(|i| i * 1_637).collect()
}

/// The crowd over few short prompts: many hold each block, so a match compares whole holder sets
/// (past `LOOKUP_AT_MOST` matching), by print for the spilled ones.
fn crowded_op() -> impl Strategy<Value = Op> {
    let id = proptest::sample::select(crowd());
    let prompt = proptest::collection::vec(0..2u8, 1..5);
    prop_oneof![
        8 => (id.clone(), prompt.clone()).prop_map(|(i, p)| Op::Insert(i, p)),
        3 => (id.clone(), prompt, 0..4usize).prop_map(|(i, p, k)| Op::Remove(i, p, k)),
        1 => id.prop_map(Op::Clear),
    ]
}

proptest! {
    #[test]
    fn crowded_blocks_match_the_naive_model(
        ops in proptest::collection::vec(crowded_op(), 50..400),
        queries in proptest::collection::vec(proptest::collection::vec(0..2u8, 1..6), 1..8),
    ) {
        let (index, naive) = filled(&ops);
        matches_agree(&index, &naive, &queries, &crowd())?;
    }

    #[test]
    fn matches_the_naive_model_while_nothing_is_evicted(
        ops in proptest::collection::vec(op(), 0..60),
        queries in proptest::collection::vec(proptest::collection::vec(0..4u8, 0..8), 1..8),
    ) {
        let (index, naive) = filled(&ops);
        prop_assert_eq!(index.len(), naive.held.len());
        matches_agree(&index, &naive, &queries, &IDS)?;
    }

    #[test]
    fn under_eviction_it_stays_bounded_and_never_claims_a_block_it_was_not_given(
        ops in proptest::collection::vec(op(), 0..120),
        queries in proptest::collection::vec(proptest::collection::vec(0..4u8, 0..8), 1..8),
    ) {
        // 16 shards of 2 slots.
        let index = EventIndex::new(32);
        let mut naive = Naive::default();
        for op in &ops {
            apply(&index, &mut naive, op);
            prop_assert!(index.len() <= 32);
            if let Op::Insert(id, p) = op {
                // The block just stored is always there.
                let c = chain(p);
                let last = *c.last().unwrap();
                prop_assert!(index.match_prefix(&[last], &EndpointSet::of(IDS), 0).get(*id) == 1);
            }
        }
        for q in &queries {
            let hashes = chain(q);
            let got = index.match_prefix(&hashes, &EndpointSet::of(IDS), 0);
            for id in IDS {
                prop_assert!(got.get(id) <= naive.count(id, &hashes));
            }
        }
    }

    #[test]
    fn leases_match_the_naive_model_with_expiry(
        routes in proptest::collection::vec((0..4usize, proptest::collection::vec(0..3u8, 1..5), 0..50u32), 0..30),
        now in 0..80u32,
        query in proptest::collection::vec(0..3u8, 1..6),
    ) {
        let index = RoutedIndex::new(1 << 12);
        let ttl = 20;
        let mut latest: HashMap<(EndpointId, BlockHash), Tick> = HashMap::new();
        for (id, p, at) in &routes {
            index.record_routed(*id, &chain(p), *at, ttl);
            for h in chain(p) {
                latest.insert((*id, h), at + ttl);
            }
        }
        let hashes = chain(&query);
        let got = index.match_prefix(&hashes, &all(4), now);
        for id in 0..4 {
            let want = hashes.iter().take_while(|h| latest.get(&(id, **h)).is_some_and(|&u| u > now)).count();
            prop_assert_eq!(got.get(id) as usize, want);
        }
    }
}

#[test]
fn counts_leading_blocks_only() {
    let index = EventIndex::new(1024);
    let c = chain(&[1, 2, 3, 4]);
    index.insert(0, &c, 0);
    index.insert(1, &c[..2], 0);
    index.insert(2, &c[1..], 0); // holds later blocks but not the first: no prefix
    let m = index.match_prefix(&c, &all(4), 0);
    assert_eq!((m.get(0), m.get(1), m.get(2), m.get(3)), (4, 2, 0, 0));
}

#[test]
fn candidates_restrict_the_match() {
    let index = EventIndex::new(1024);
    let c = chain(&[1, 2]);
    index.insert(0, &c, 0);
    index.insert(1, &c, 0);
    let m = index.match_prefix(&c, &EndpointSet::of([1]), 0);
    assert_eq!((m.get(0), m.get(1)), (0, 2));
}

#[test]
fn eviction_keeps_blocks_in_use() {
    // One shard's worth of traffic: hashes chosen to land in shard 0, which holds 4 blocks.
    let index = EventIndex::new(4 * SHARDS);
    let hot: Vec<BlockHash> = (0..2u64).map(|i| i + 1).collect();
    index.insert(0, &hot, 0);
    for cold in 100..140u64 {
        index.insert(0, &[cold], 0);
        // The hot prefix is matched between every store.
        assert_eq!(
            index.match_prefix(&hot, &all(1), 0).get(0),
            2,
            "hot blocks evicted at {cold}"
        );
    }
    assert_eq!(index.len(), 4);
}

#[test]
fn removing_the_last_holder_frees_the_block() {
    let index = EventIndex::new(1024);
    let c = chain(&[1]);
    index.insert(0, &c, 0);
    index.insert(1, &c, 0);
    index.remove(0, c[0]);
    assert_eq!(index.len(), 1);
    index.remove(1, c[0]);
    assert!(index.is_empty());
    index.insert(2, &c, 0);
    assert_eq!(index.match_prefix(&c, &all(3), 0).get(2), 1, "a freed slot is reused");
}

#[test]
fn ten_thousand_endpoints_share_blocks_and_let_go_of_them() {
    let index = EventIndex::new(1 << 12);
    let shared = chain(&[1, 2, 3]);
    let n = 10_000;
    for id in 0..n {
        // Everyone holds the first block, every other endpoint two, every tenth all three.
        let depth = if id % 10 == 0 { 3 } else { 1 + usize::from(id % 2 == 0) };
        index.insert(id, &shared[..depth], 0);
    }
    let m = index.match_prefix(&shared, &all(n), 0);
    for id in [0, 1, 2, 127, 128, 5_000, 9_998, 9_999] {
        let want = if id % 10 == 0 { 3 } else { 1 + u32::from(id % 2 == 0) };
        assert_eq!(m.get(id), want, "endpoint {id}");
    }
    assert_eq!(m.iter().count(), n);
    // Candidates restrict the match at any id.
    let some = index.match_prefix(&shared, &EndpointSet::of([130, 9_990]), 0);
    assert_eq!(some.iter().collect::<Vec<_>>(), vec![(130, 3), (9_990, 3)]);
    // Removals and clears at high ids, down to a few holders (back inline) and none.
    for id in 3..n {
        if id % 2 == 0 {
            index.remove(id, shared[0]);
        } else {
            index.clear(id);
        }
    }
    let m = index.match_prefix(&shared, &all(n), 0);
    assert_eq!(m.iter().collect::<Vec<_>>(), vec![(0, 3), (1, 1), (2, 2)]);
    for id in 0..3 {
        index.clear(id);
    }
    // Blocks whose holders are all gone leave the index (the even endpoints still hold blocks 2-3).
    assert!(index.match_prefix(&shared, &all(n), 0).iter().next().is_none());
    for id in (4..n).step_by(2) {
        index.clear(id);
    }
    assert!(index.is_empty());
}

#[test]
fn memory_per_block_is_small() {
    let n = 100_000;
    let index = EventIndex::new(n);
    let hashes: Vec<BlockHash> = (0..n as u64)
        .map(|i| crate::routing::block_hash::next(ROOT, &[i as u32]))
        .collect();
    for (i, chunk) in hashes.chunks(64).enumerate() {
        index.insert(i % 64, chunk, 0);
    }
    let per_block = index.memory_bytes() as f64 / index.len() as f64;
    assert!(index.len() > n * 9 / 10, "{}", index.len());
    assert!(per_block < 40.0, "{per_block} bytes per block");
}

#[test]
fn reads_proceed_while_events_are_applied() {
    let index = Arc::new(EventIndex::new(1 << 14));
    let hot = chain(&[9, 9, 9, 9]);
    index.insert(0, &hot, 0);
    let writer = {
        let index = index.clone();
        std::thread::spawn(move || {
            for i in 0..20_000u64 {
                let h = crate::routing::block_hash::next(i, &[1]);
                index.insert((i % 8) as usize + 1, &[h], 0);
                if i % 3 == 0 {
                    index.remove((i % 8) as usize + 1, h);
                }
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let index = index.clone();
            let hot = hot.clone();
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    assert_eq!(index.match_prefix(&hot, &all(9), 0).get(0), 4);
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
}
