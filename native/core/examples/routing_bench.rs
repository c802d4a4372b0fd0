//! Routing micro-benchmark: the cost of one routing decision at 64 endpoints with a realistically
//! filled prefix index, per policy; the cost of applying KV events; and the index's memory per block,
//! measured by counting the allocator's live bytes.
//!
//! `cargo run --release --example routing_bench` (a few seconds).

use std::sync::atomic::Ordering;
use std::time::Instant;

use extproc_core::pb::kv_events as pb;
use extproc_core::routing::block_hash::{prompt_hashes, ROOT};
use extproc_core::routing::events::{EventState, OnGap};
use extproc_core::routing::policy::registry::policy_names;
use extproc_core::routing::prefix_index::EventIndex;
use extproc_core::routing::{Router, RouterConfig};

#[path = "routing_common/mod.rs"]
mod common;
use common::{percentile, stored, tokens, Lcg, BLOCK, LIVE, SYSTEM_BLOCKS, SYSTEM_PROMPTS, TAIL_BLOCKS};

const ENDPOINTS: usize = 64;

fn main() {
    let addr = |i: usize| format!("10.1.{}.{}:50051", i / 250, i % 250);
    let cfg = RouterConfig {
        max_blocks: 1 << 20,
        seed: Some(7),
        ..Default::default()
    };

    // Fill: each engine holds 96 prompts (system prefix + a user turn): 64 x 96 x 128 = 786k memberships.
    let mut rng = Lcg(1);
    let batches: Vec<(usize, Vec<u8>)> = (0..ENDPOINTS)
        .flat_map(|e| (0..96u64).map(move |k| (e, k)))
        .map(|(e, k)| {
            let system = rng.next() % SYSTEM_PROMPTS;
            (
                e,
                stored(
                    k + 1,
                    &tokens(system, rng.next()),
                    ((e as i64) << 40) + ((k as i64) << 20),
                ),
            )
        })
        .collect();

    let probe_router = Router::new("kv_events", cfg.clone()).unwrap();
    probe_router
        .set_endpoints((0..ENDPOINTS).map(|i| (addr(i), BLOCK as u32)).collect())
        .unwrap();
    let t0 = Instant::now();
    let mut blocks = 0u64;
    for (e, b) in &batches {
        let r = probe_router.apply_kv_events(&addr(*e), b);
        assert_eq!(r.outcome.kind(), "applied");
        blocks += u64::from(TAIL_BLOCKS + SYSTEM_BLOCKS);
    }
    let apply_s = t0.elapsed().as_secs_f64();
    let stats = probe_router.index_stats();
    println!(
        "apply: {} batches of {} blocks in {:.3} s: {:.2} us/batch, {:.0} ns/block; index {} blocks, {:.1} MiB (indexes + engine maps)",
        batches.len(),
        TAIL_BLOCKS + SYSTEM_BLOCKS,
        apply_s,
        apply_s * 1e6 / batches.len() as f64,
        apply_s * 1e9 / blocks as f64,
        stats.event_blocks,
        stats.memory_bytes as f64 / (1 << 20) as f64
    );
    drop(probe_router);

    println!(
        "\npick latency, {ENDPOINTS} endpoints, {}-token prompts ({} blocks of {BLOCK}), index as above:",
        tokens(0, 0).len(),
        SYSTEM_BLOCKS + TAIL_BLOCKS
    );
    println!(
        "{:<16} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "policy", "mean us", "p50 us", "p99 us", "p99.9 us", "max us"
    );
    for policy in policy_names() {
        let router = Router::new(policy, cfg.clone()).unwrap();
        router
            .set_endpoints((0..ENDPOINTS).map(|i| (addr(i), BLOCK as u32)).collect())
            .unwrap();
        for (e, b) in &batches {
            router.apply_kv_events(&addr(*e), b);
        }
        let mut rng = Lcg(2);
        let requests: Vec<(Vec<u32>, String)> = (0..2000)
            .map(|u| {
                (
                    tokens(rng.next() % SYSTEM_PROMPTS, 1_000_000 + u),
                    format!("session-{u}"),
                )
            })
            .collect();
        let mut held = std::collections::VecDeque::new();
        let mut samples = Vec::with_capacity(20_000);
        for i in 0..20_000 {
            let (t, key) = &requests[i % requests.len()];
            let start = Instant::now();
            let pick = router.pick(t, Some(key)).expect("healthy endpoints");
            samples.push(start.elapsed().as_secs_f64() * 1e6);
            // Keep ~200 requests in flight so loads vary.
            held.push_back(pick);
            if held.len() > 200 {
                held.pop_front();
            }
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        println!(
            "{policy:<16} {mean:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            percentile(&samples, 0.5),
            percentile(&samples, 0.99),
            percentile(&samples, 0.999),
            samples[samples.len() - 1]
        );
    }

    // Memory per block: live allocator bytes of an index holding n distinct blocks (one holder each),
    // then with the engine-hash map that event application keeps for Removed events.
    let n = 500_000usize;
    let hashes: Vec<u64> = (0..n as u32)
        .flat_map(|i| prompt_hashes(&[i; BLOCK], BLOCK, ROOT))
        .collect();
    let before = LIVE.load(Ordering::Relaxed);
    let index = EventIndex::new(n);
    for (i, chunk) in hashes.chunks(128).enumerate() {
        index.insert(i % ENDPOINTS, chunk, 0);
    }
    let index_bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "\nmemory: precise index, {} blocks: {:.1} bytes/block (allocator), {:.1} bytes/block (table sizes)",
        index.len(),
        index_bytes as f64 / index.len() as f64,
        index.memory_bytes() as f64 / index.len() as f64
    );
    drop(index);
    let chain: Vec<u32> = (0..(n * BLOCK) as u32).collect();
    let before = LIVE.load(Ordering::Relaxed);
    let index = EventIndex::new(n);
    let mut state = EventState::new(n);
    for (k, part) in chain.chunks(128 * BLOCK).enumerate() {
        let parent = (k > 0).then(|| (k * 128 - 1) as i64);
        let blocks = part
            .chunks_exact(BLOCK)
            .enumerate()
            .map(|(j, b)| pb::KvBlock {
                block_hash: (k * 128 + j) as i64,
                token_ids: b.to_vec(),
                block_size: BLOCK as i32,
                ..Default::default()
            })
            .collect();
        let ev = pb::KvCacheEvent {
            event_id: 0,
            data: Some(pb::kv_cache_event::Data::Stored(pb::KvBlocksStored {
                blocks,
                parent_block_hash: parent,
                ..Default::default()
            })),
        };
        let batch = pb::KvEventBatch {
            sequence_number: k as u64 + 1,
            events: vec![ev],
            ..Default::default()
        };
        assert_eq!(
            state.apply_batch(&index, 0, &batch, OnGap::Break).outcome.kind(),
            "applied"
        );
    }
    let with_map = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "memory: precise index + engine-hash map, {} blocks: {:.1} bytes/block (allocator)",
        index.len(),
        with_map as f64 / index.len() as f64
    );
}
