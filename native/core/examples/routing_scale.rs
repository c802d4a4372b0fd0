//! Scale benchmark of the routing decision (issue 13): the `kv_events` pick's p50/p99 as the endpoint
//! count grows, with a loaded prefix index, and the index's memory per cached block.
//!
//! `cargo run --release --example routing_scale -p extproc-core` (under a minute on 2 shared cores;
//! `-- 64 1000` measures only those counts). Two parts:
//! 1. Whole picks (`Router::pick`: hash the prompt, match the index, build the candidates or, from 128
//!    endpoints on, the shortlist, rank, book the in-flight guard) at 16 to 10,000 endpoints, the index filled through KV events with prompts of
//!    128 blocks (a 64-block prefix out of 256 shared ones, then a unique tail): 96 per endpoint up to
//!    64 endpoints, then 6,144 in all (at least 4 per endpoint), so the larger routers hold as many
//!    prompts or more. Requests share a system prefix with the index and nothing more; ~3 requests
//!    stay in flight per endpoint so loads vary. Beside the run's percentiles, the range of its ten
//!    consecutive slices' own p50 and p99: a shared host's speed drifts over seconds, and a wide range
//!    says the run's p99 is partly that drift.
//!    Then 1,000 and 10,000 endpoints again with 3% of them just added (`fresh` column): they publish
//!    events but hold nothing, so each pick's shortlist walks the fresh ones and they take a share of
//!    the picks (printed below the row).
//!    Then 64, 1,000 and 10,000 endpoints with underused endpoints priced (`{"underused_share": 0.5}`
//!    beside the default cold booking), each endpoint first sent 0 to 8 requests: 14 to 2,200 of them
//!    underused, so each pick's shortlist adds the least waiting of them (the load order keeps the
//!    underused endpoints by wait, moving those that cross the cut as the pool's mean moves).
//!    Then the same with busy endpoints priced instead (`{"busy_miss_weight": 1}`): about half of them
//!    above the mean, each of those the shortlist's walk passes listed beside the first non-busy ones.
//!    Memory: allocator bytes the filled index added (both indexes, every endpoint's engine-hash map)
//!    over distinct indexed blocks and over memberships; and the precise index's own tables per block
//!    (`IndexStats::index_bytes`).
//! 2. The ranking alone (the `kv_events` policy over synthetic candidates with varied loads and cached
//!    prefixes) at 64, 1,000 and 10,000 candidates: the top 4 as a pick asks for them (`rank_top`,
//!    primary + 3 fallbacks) and the full ranking (`rank`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use extproc_core::pb::kv_events::KvEventBatch;
use extproc_core::routing::policy::registry::policy;
use extproc_core::routing::policy::{Candidate, PickContext};
use extproc_core::routing::rng::Rng;
use extproc_core::routing::{EngineLoad, Load, Router, RouterConfig};
use prost::Message;

#[path = "routing_common/mod.rs"]
mod common;
use common::{percentile, stored, tokens, Lcg, BLOCK, LIVE, SYSTEM_BLOCKS, SYSTEM_PROMPTS, TAIL_BLOCKS};

const PICKS: usize = 20_000;
/// Consecutive slices of the picks whose own percentiles are reported beside the whole run's.
const SLICES: usize = 10;

/// Prompts indexed per endpoint at `n` endpoints: 96 up to 64 endpoints, then 6,144 in all.
fn prompts_per_endpoint(n: usize) -> u64 {
    (6_144 / n as u64).clamp(4, 96)
}

fn addr(i: usize) -> String {
    format!("10.{}.{}.{}:50051", i / 62_500, (i / 250) % 250, i % 250)
}

fn cfg() -> RouterConfig {
    RouterConfig {
        max_blocks: 1 << 21,
        seed: Some(7),
        ..Default::default()
    }
}

/// With underused endpoints priced (`underused_share`, a setting; cold booking is on by default).
fn underused_cfg() -> RouterConfig {
    RouterConfig {
        underused_share: 0.5,
        ..cfg()
    }
}

/// With busy endpoints priced (`busy_miss_weight`).
fn busy_cfg() -> RouterConfig {
    RouterConfig {
        busy_miss_weight: 1.0,
        ..cfg()
    }
}

/// Whole picks at `n` endpoints with a filled index; prints latency and memory. The last `fresh`
/// endpoints publish events but hold nothing (engines just added): fresh whenever idle, so every pick's
/// shortlist walks them and they take a share of the picks. `demand`: a config pricing recent
/// requests (`underused_cfg`, `busy_cfg`), each endpoint first sent 0 to 8 requests (uniformly; mean
/// 4, so 2 in 9 are under half of it and 4 in 9 above it).
fn whole_picks(n: usize, fresh: usize, demand: Option<RouterConfig>) {
    let priced = demand.is_some();
    let router = Router::new("kv_events", demand.unwrap_or_else(cfg)).unwrap();
    router
        .set_endpoints((0..n).map(|i| (addr(i), BLOCK as u32)).collect())
        .unwrap();
    if priced {
        let mut rng = Lcg(4);
        for e in 0..n {
            for _ in 0..rng.next() % 9 {
                drop(router.begin(&addr(e), None, 0));
            }
        }
    }
    let before = LIVE.load(Ordering::Relaxed);
    let per_endpoint = prompts_per_endpoint(n);
    let mut rng = Lcg(1);
    let empty = KvEventBatch::default().encode_to_vec();
    for e in n - fresh..n {
        assert_eq!(router.apply_kv_events(&addr(e), &empty).outcome.kind(), "applied");
    }
    for e in 0..n - fresh {
        for k in 0..per_endpoint {
            let system = rng.next() % SYSTEM_PROMPTS;
            let batch = stored(
                k + 1,
                &tokens(system, rng.next()),
                ((e as i64) << 40) + ((k as i64) << 20),
            );
            assert_eq!(router.apply_kv_events(&addr(e), &batch).outcome.kind(), "applied");
        }
    }
    let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
    let stats = router.index_stats();
    let memberships = (n - fresh) as f64 * per_endpoint as f64 * f64::from(SYSTEM_BLOCKS + TAIL_BLOCKS);
    let fresh_names: std::collections::HashSet<String> = (n - fresh..n).map(addr).collect();
    let mut on_fresh = 0usize;

    let mut rng = Lcg(2);
    let requests: Vec<Vec<u32>> = (0..2000)
        .map(|u| tokens(rng.next() % SYSTEM_PROMPTS, 1_000_000 + u))
        .collect();
    let mut held = std::collections::VecDeque::new();
    let mut samples = Vec::with_capacity(PICKS);
    for i in 0..PICKS {
        let t = &requests[i % requests.len()];
        let start = Instant::now();
        let pick = router.pick(t, None).expect("healthy endpoints");
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        on_fresh += usize::from(fresh_names.contains(&*pick.primary));
        // ~3 requests in flight per endpoint so loads vary and the ranking has work to do.
        held.push_back(pick);
        if held.len() > 3 * n {
            held.pop_front();
        }
    }
    // The machine's speed drifts over seconds (other tenants of a shared host): each tenth of the run's
    // own p50 and p99, the fastest and slowest, show how much of the run's p99 is that drift.
    let slices: Vec<(f64, f64)> = samples
        .chunks(PICKS / SLICES)
        .map(|chunk| {
            let mut chunk = chunk.to_vec();
            chunk.sort_by(f64::total_cmp);
            (percentile(&chunk, 0.5), percentile(&chunk, 0.99))
        })
        .collect();
    let range = |f: fn(&(f64, f64)) -> f64| {
        let values = slices.iter().map(f);
        (values.clone().fold(f64::INFINITY, f64::min), values.fold(0.0, f64::max))
    };
    let (p50_lo, p50_hi) = range(|s| s.0);
    let (p99_lo, p99_hi) = range(|s| s.1);
    samples.sort_by(f64::total_cmp);
    println!(
        "{n:>6} {fresh:>5} {per_endpoint:>4} {:>9.2} {:>9.2} {:>9.2} {:>13} {:>13} {:>10} {:>11.0} {:>10.1} {:>12.1} {:>12.1}",
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        percentile(&samples, 0.999),
        format!("{p50_lo:.1}-{p50_hi:.1}"),
        format!("{p99_lo:.1}-{p99_hi:.1}"),
        stats.event_blocks,
        memberships,
        bytes / stats.event_blocks as f64,
        bytes / memberships,
        stats.index_bytes as f64 / stats.event_blocks as f64
    );
    if fresh > 0 {
        println!(
            "       picks on the {fresh} fresh endpoints: {:.1}%",
            100.0 * on_fresh as f64 / PICKS as f64
        );
    }
}

/// The `kv_events` ranking alone over `n` synthetic candidates.
fn ranking(n: usize) {
    let policy = policy("kv_events", &cfg()).unwrap();
    let mut rng = Lcg(3);
    let sets: Vec<Vec<Candidate>> = (0..64)
        .map(|_| {
            (0..n)
                .map(|id| {
                    let requests = rng.next() % 12;
                    Candidate {
                        id,
                        address_hash: u64::from(rng.next()),
                        load: Load {
                            in_flight_requests: requests,
                            in_flight_tokens: u64::from(requests) * 1500,
                            prefill_tokens: u64::from(rng.next() % 3000),
                            prefilling_requests: 0,
                            engine: EngineLoad::default(),
                        },
                        cached_blocks: if rng.next().is_multiple_of(8) {
                            rng.next() % 128
                        } else {
                            0
                        },
                        prompt_blocks: 128,
                        prompt_tokens: 2048,
                        block_size: BLOCK as u32,
                        tie: u64::from(rng.next()),
                        residents: 0,
                        fresh: false,
                        underused: false,
                        busy: 0.0,
                    }
                })
                .collect()
        })
        .collect();
    let dice = Rng::new(9);
    let rounds = (2_000_000 / n).clamp(200, PICKS);
    let mut top = Vec::with_capacity(rounds);
    let mut full = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let ctx = PickContext {
            candidates: &sets[i % sets.len()],
            session_key: None,
            rng: &dice,
        };
        let start = Instant::now();
        let order = policy.rank_top(&ctx, 4);
        top.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(order.len(), 4);
        let start = Instant::now();
        let order = policy.rank(&ctx);
        full.push(start.elapsed().as_secs_f64() * 1e6);
        assert_eq!(order.len(), n);
    }
    top.sort_by(f64::total_cmp);
    full.sort_by(f64::total_cmp);
    println!(
        "{n:>6} {:>9.2} {:>9.2} {:>9.2} {:>12.2} {:>12.2}",
        percentile(&top, 0.5),
        percentile(&top, 0.99),
        percentile(&top, 0.999),
        percentile(&full, 0.5),
        percentile(&full, 0.99)
    );
}

fn main() {
    let only: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let wanted = |n: &usize| only.is_empty() || only.contains(n);
    println!(
        "whole kv_events picks, 2,048-token prompts ({} blocks of {BLOCK}), prompts indexed per endpoint in column 2:",
        SYSTEM_BLOCKS + TAIL_BLOCKS
    );
    println!(
        "{:>6} {:>5} {:>4} {:>9} {:>9} {:>9} {:>13} {:>13} {:>10} {:>11} {:>10} {:>12} {:>12}",
        "n",
        "fresh",
        "per",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "tenths p50",
        "tenths p99",
        "blocks",
        "memberships",
        "B/block",
        "B/membership",
        "index B/blk"
    );
    for n in [16, 64, 128, 1_000, 10_000].into_iter().filter(wanted) {
        whole_picks(n, 0, None);
    }
    // A scale-out: 3% of the pool just added (300 of 10,000).
    for n in [1_000, 10_000].into_iter().filter(wanted) {
        whole_picks(n, n * 3 / 100, None);
    }
    println!("with underused endpoints priced ({{\"underused_share\": 0.5}}), 2 in 9 underused:");
    for n in [64, 1_000, 10_000].into_iter().filter(wanted) {
        whole_picks(n, 0, Some(underused_cfg()));
    }
    println!("with busy endpoints priced ({{\"busy_miss_weight\": 1}}), 4 in 9 above the mean:");
    for n in [64, 1_000, 10_000].into_iter().filter(wanted) {
        whole_picks(n, 0, Some(busy_cfg()));
    }
    println!("\nkv_events ranking alone, synthetic candidates (1 in 8 holding a prefix):");
    println!(
        "{:>6} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "n", "top4 p50", "top4 p99", "top4 p99.9", "full p50 us", "full p99 us"
    );
    for n in [64, 1_000, 10_000].into_iter().filter(wanted) {
        ranking(n);
    }
}
