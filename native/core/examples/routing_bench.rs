//! Routing micro-benchmark: the cost of one routing decision at 64 endpoints with a realistically
//! filled prefix index, per policy; the cost of applying KV events; and the index's memory per block,
//! measured by counting the allocator's live bytes.
//!
//! `cargo run --release --example routing_bench` (a few seconds).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use prost::Message;

use extproc_core::pb::kv_events as pb;
use extproc_core::routing::block_hash::{prompt_hashes, ROOT};
use extproc_core::routing::events::{EventState, OnGap};
use extproc_core::routing::policy::registry::policy_names;
use extproc_core::routing::prefix_index::EventIndex;
use extproc_core::routing::{Router, RouterConfig};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ENDPOINTS: usize = 64;
const BLOCK: usize = 16;
const SYSTEM_PROMPTS: u32 = 256;
const SYSTEM_BLOCKS: u32 = 64; // 1,024-token shared prefixes
const TAIL_BLOCKS: u32 = 64; // 1,024 tokens per user turn

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

fn tokens(system: u32, user: u32) -> Vec<u32> {
    let mut t: Vec<u32> = (0..SYSTEM_BLOCKS as usize * BLOCK)
        .map(|i| system * 1_000_003 + i as u32)
        .collect();
    t.extend((0..TAIL_BLOCKS as usize * BLOCK).map(|i| 0x4000_0000 + user * 7919 + i as u32));
    t
}

fn stored(seq: u64, t: &[u32], engine_hash_base: i64) -> Vec<u8> {
    let blocks = t
        .chunks_exact(BLOCK)
        .enumerate()
        .map(|(k, b)| pb::KvBlock {
            block_hash: engine_hash_base + k as i64,
            token_ids: b.to_vec(),
            block_size: BLOCK as i32,
            ..Default::default()
        })
        .collect();
    let ev = pb::KvCacheEvent {
        event_id: 0,
        data: Some(pb::kv_cache_event::Data::Stored(pb::KvBlocksStored {
            blocks,
            ..Default::default()
        })),
    };
    pb::KvEventBatch {
        sequence_number: seq,
        events: vec![ev],
        ..Default::default()
    }
    .encode_to_vec()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

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
