//! The router end to end: endpoints, health, subset, events → kv_events picks, approximate affinity,
//! spill gate, in-flight accounting, fallbacks, concurrency.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use prost::Message;

use super::*;
use crate::pb::kv_events as pb;
use crate::pb::kv_events::kv_cache_event::Data;
use crate::routing::penalty::Backoff;

const B: u32 = 4;

fn addr(i: usize) -> String {
    format!("10.0.0.{i}:50051")
}

fn router(policy: &str, n: usize) -> Router {
    router_with(
        policy,
        n,
        RouterConfig {
            seed: Some(42),
            ..Default::default()
        },
    )
}

fn router_with(policy: &str, n: usize, cfg: RouterConfig) -> Router {
    let r = Router::new(policy, cfg).unwrap();
    r.set_endpoints((0..n).map(|i| (addr(i), B)).collect()).unwrap();
    r
}

/// Marks every endpoint as routed to before, as in a pool that has served traffic: one whose events show
/// nothing is then fresh only if it publishes events (`fresh_cache_weight`), so that a test of another
/// term is not decided by an engine that looks new.
fn served(r: &Router) {
    for st in r.read_table().slots.iter().flatten() {
        st.mark_routed();
    }
}

/// A prompt of `blocks` full blocks, block k made of token `seed * 100 + k`.
fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks).flat_map(|k| [seed * 100 + k; B as usize]).collect()
}

/// A batch storing `tokens`' full blocks as one chain (engine hashes derived from `salt`).
fn stored_batch(seq: u64, tokens: &[u32], salt: i64) -> Vec<u8> {
    let blocks = tokens
        .chunks_exact(B as usize)
        .enumerate()
        .map(|(k, t)| pb::KvBlock {
            block_hash: salt * 1000 + k as i64,
            token_ids: t.to_vec(),
            block_size: B as i32,
            ..Default::default()
        })
        .collect();
    let event = pb::KvCacheEvent {
        event_id: 1,
        data: Some(Data::Stored(pb::KvBlocksStored {
            blocks,
            ..Default::default()
        })),
    };
    pb::KvEventBatch {
        sequence_number: seq,
        events: vec![event],
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn router_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Router>();
    check::<Pick>();
}

#[test]
fn unknown_policy_is_an_error() {
    assert!(matches!(
        Router::new("nope", RouterConfig::default()),
        Err(RoutingError::UnknownPolicy { .. })
    ));
}

#[test]
fn unhealthy_endpoints_are_never_picked() {
    for policy in crate::routing::policy::registry::policy_names() {
        let r = router(policy, 4);
        r.set_health(&addr(1), false);
        r.set_health(&addr(3), false);
        for i in 0..200u32 {
            let key = format!("s{i}");
            let p = r.pick(&prompt(i % 5, 3), Some(&key)).unwrap();
            assert!(
                *p.primary == addr(0) || *p.primary == addr(2),
                "{policy} picked {}",
                p.primary
            );
            assert!(p.fallbacks.iter().all(|f| **f == addr(0) || **f == addr(2)), "{policy}");
        }
        r.set_health(&addr(0), false);
        r.set_health(&addr(2), false);
        assert!(r.pick(&prompt(1, 3), None).is_none(), "{policy}: nothing ready");
    }
}

#[test]
fn the_subset_hint_restricts_the_pick() {
    let r = router("round_robin", 4);
    let subset = [addr(2)];
    let subset: Vec<&str> = subset.iter().map(String::as_str).collect();
    for _ in 0..5 {
        let p = r
            .pick_with(&PickRequest {
                token_ids: &[1],
                subset: Some(&subset),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(&*p.primary, addr(2));
        assert!(p.fallbacks.is_empty());
    }
    let none: Vec<&str> = vec!["10.9.9.9:1"];
    assert!(r
        .pick_with(&PickRequest {
            token_ids: &[1],
            subset: Some(&none),
            ..Default::default()
        })
        .is_none());
}

#[test]
fn fallbacks_are_distinct_ordered_and_bounded() {
    let r = router_with(
        "least_load",
        6,
        RouterConfig {
            max_fallbacks: 3,
            seed: Some(1),
            ..Default::default()
        },
    );
    let _busy: Vec<_> = (0..6)
        .flat_map(|i| (0..i).map(move |_| addr(i)))
        .map(|a| r.begin(&a, None, 0).unwrap())
        .collect();
    let p = r.pick(&[], None).unwrap();
    assert_eq!(&*p.primary, addr(0));
    assert_eq!(
        p.fallbacks.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        vec![addr(1), addr(2), addr(3)]
    );
}

#[test]
fn kv_events_routes_to_the_holder_of_the_longest_prefix() {
    let r = router("kv_events", 4);
    served(&r);
    let system = prompt(7, 6);
    assert_eq!(
        r.apply_kv_events(&addr(2), &stored_batch(1, &system, 1)).outcome.kind(),
        "applied"
    );
    assert_eq!(
        r.apply_kv_events(&addr(1), &stored_batch(1, &system[..8], 2))
            .outcome
            .kind(),
        "applied"
    );
    let mut request = system.clone();
    request.extend([9, 9, 9, 9, 9, 9]);
    let p = r.pick(&request, None).unwrap();
    assert_eq!(&*p.primary, addr(2));
    assert_eq!((p.cached_blocks, p.cached_tokens()), (6, 24));
    assert_eq!(
        &*p.fallbacks[0],
        addr(1),
        "the next longest prefix is the first fallback"
    );
    // An unrelated prompt goes by load: not to endpoint 2, which has one request in flight.
    let other = r.pick(&prompt(3, 6), None).unwrap();
    assert_ne!(&*other.primary, addr(2));
    assert_eq!(other.cached_blocks, 0);
}

#[test]
fn the_spill_gate_diverts_from_an_overloaded_holder() {
    let cfg = RouterConfig {
        spill_abs: 4,
        spill_ratio: 1.5,
        seed: Some(3),
        ..Default::default()
    };
    let r = router_with("kv_events", 3, cfg);
    let p = prompt(5, 4);
    r.apply_kv_events(&addr(0), &stored_batch(1, &p, 1));
    let mut held = Vec::new();
    let mut to_holder = 0;
    for _ in 0..20 {
        let pick = r.pick(&p, None).unwrap();
        to_holder += usize::from(*pick.primary == addr(0));
        held.push(pick.in_flight);
    }
    // The holder takes requests while it has at most min + 4 of them (and min grows as others fill).
    let on_holder = r
        .endpoints()
        .iter()
        .find(|e| *e.address == addr(0))
        .unwrap()
        .load
        .in_flight_requests;
    let others: Vec<u32> = r
        .endpoints()
        .iter()
        .filter(|e| *e.address != addr(0))
        .map(|e| e.load.in_flight_requests)
        .collect();
    assert!((5..20).contains(&to_holder), "holder took {to_holder}");
    assert!(
        on_holder <= others.iter().min().unwrap() + 5,
        "{on_holder} vs {others:?}"
    );
    drop(held);
}

#[test]
fn engine_loads_from_events_and_polls_steer_least_load() {
    let r = router("least_load", 2);
    let load = pb::EngineLoad {
        running_requests: 30,
        waiting_requests: 5,
        token_usage: 0.9,
        ..Default::default()
    };
    let batch = pb::KvEventBatch {
        sequence_number: 1,
        load: Some(load),
        ..Default::default()
    }
    .encode_to_vec();
    let res = r.apply_kv_events(&addr(0), &batch);
    assert_eq!(res.load.map(|l| l.running), Some(30));
    assert_eq!(&*r.pick(&[], None).unwrap().primary, addr(1));
    r.set_engine_load(
        &addr(1),
        None,
        &EngineLoad {
            running: 50,
            ..Default::default()
        },
    );
    assert_eq!(&*r.pick(&[], None).unwrap().primary, addr(0));
}

#[test]
fn in_flight_accounting_follows_the_guards() {
    let r = router("least_load", 2);
    let a = r.pick(&[1, 2, 3], None).unwrap();
    let b = r.pick(&[1, 2, 3, 4], None).unwrap();
    assert_ne!(a.primary, b.primary, "the first pick's request counts");
    let loads = |r: &Router| {
        r.endpoints()
            .iter()
            .map(|e| (e.load.in_flight_requests, e.load.in_flight_tokens))
            .collect::<Vec<_>>()
    };
    let mut l = loads(&r);
    l.sort();
    assert_eq!(l, vec![(1, 3), (1, 4)]);
    drop(a);
    drop(b);
    assert_eq!(loads(&r), vec![(0, 0), (0, 0)]);
}

#[test]
fn prefill_work_counts_until_the_first_token() {
    let r = router("kv_events", 1);
    let tokens = prompt(1, 3);
    r.apply_kv_events(&addr(0), &stored_batch(0, &tokens[..2 * B as usize], 1));
    let prefill = |r: &Router| r.endpoints()[0].load.prefill_tokens;
    // Two of the three blocks are cached: one block's tokens are left to prefill.
    let mut a = r.pick(&tokens, None).unwrap();
    assert_eq!((a.cached_blocks, prefill(&r)), (2, u64::from(B)));
    let b = r.pick(&prompt(2, 3), None).unwrap();
    assert_eq!(prefill(&r), u64::from(4 * B), "a cold prompt adds all of its tokens");
    a.in_flight.first_token();
    a.in_flight.first_token();
    assert_eq!(
        prefill(&r),
        u64::from(3 * B),
        "the first token releases the share, once"
    );
    drop(b);
    drop(a);
    assert_eq!(prefill(&r), 0);
}

#[test]
fn accounting_does_not_leak_across_threads() {
    let r = Arc::new(router("power_of_two", 8));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..2000u32 {
                    held.push(r.pick(&prompt(i % 7, 2), None).unwrap());
                    if (i + t) % 3 == 0 {
                        held.clear();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(r
        .endpoints()
        .iter()
        .all(|e| e.load.in_flight_requests == 0 && e.load.in_flight_tokens == 0));
}

#[test]
fn prefix_cache_learns_from_its_own_decisions() {
    let r = router("prefix_cache", 4);
    let p = prompt(11, 5);
    let first = r.pick(&p, None).unwrap();
    assert_eq!(first.cached_blocks, 0);
    let target = first.primary.clone();
    drop(first);
    for _ in 0..5 {
        let again = r.pick(&p, None).unwrap();
        assert_eq!(again.primary, target, "the same prompt follows its first decision");
        assert_eq!(again.cached_blocks, 5);
    }
    // Distinct prompts still spread (cold ones go by load, and each request stays in flight).
    let picks: Vec<Pick> = (0..4).map(|i| r.pick(&prompt(20 + i, 5), None).unwrap()).collect();
    let distinct: std::collections::HashSet<_> = picks.iter().map(|p| p.primary.clone()).collect();
    assert_eq!(distinct.len(), 4, "{distinct:?}");
}

#[test]
fn malformed_bytes_need_a_resync() {
    let r = router("kv_events", 1);
    let out = r.apply_kv_events(&addr(0), &[0xff, 0xff, 0xff]).outcome;
    assert_eq!(out.kind(), "malformed");
    assert!(out.needs_resync());
}

#[test]
fn a_gap_clears_the_endpoint_until_reset() {
    let r = router("kv_events", 2);
    let p = prompt(3, 3);
    r.apply_kv_events(&addr(1), &stored_batch(1, &p, 1));
    assert_eq!(r.pick(&p, None).unwrap().cached_blocks, 3);
    let gap = r.apply_kv_events(&addr(1), &stored_batch(5, &p, 1)).outcome;
    assert_eq!(gap, EventOutcome::Gap { expected: 2, got: 5 });
    assert_eq!(r.pick(&p, None).unwrap().cached_blocks, 0);
    assert!(r.reset_kv_events(&addr(1)));
    assert_eq!(
        r.apply_kv_events(&addr(1), &stored_batch(9, &p, 1)).outcome.kind(),
        "applied"
    );
    assert_eq!(r.pick(&p, None).unwrap().cached_blocks, 3);
    assert_eq!(
        r.apply_kv_events("10.9.9.9:1", &stored_batch(1, &p, 1)).outcome,
        EventOutcome::UnknownEndpoint
    );
}

#[test]
fn block_size_is_learned_from_events() {
    let r = Router::new("kv_events", RouterConfig::default()).unwrap();
    r.set_endpoints(vec![(addr(0), 0), (addr(1), 0)]).unwrap();
    let p = prompt(1, 3);
    r.apply_kv_events(&addr(1), &stored_batch(1, &p, 1));
    let pick = r.pick(&p, None).unwrap();
    assert_eq!(
        (&*pick.primary, pick.cached_blocks, pick.block_size),
        (addr(1).as_str(), 3, B)
    );
}

/// A batch of one event (`Removed` of engine hashes, or `Cleared` when `None`).
fn removal_batch(seq: u64, engine_hashes: Option<&[i64]>) -> Vec<u8> {
    let data = match engine_hashes {
        Some(h) => Data::Removed(pb::KvBlocksRemoved {
            block_hashes: h.to_vec(),
            ..Default::default()
        }),
        None => Data::Cleared(pb::KvCacheCleared::default()),
    };
    pb::KvEventBatch {
        sequence_number: seq,
        events: vec![pb::KvCacheEvent {
            event_id: 1,
            data: Some(data),
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn ten_thousand_endpoints_route_by_prefix_with_events_at_high_ids() {
    let n = 10_000;
    let r = router("kv_events", n);
    served(&r);
    assert_eq!(r.endpoints().len(), n);
    let system = prompt(7, 6);
    // 9,999 holds all 6 blocks, 5,000 the first 4, 200 the first 2; ids past 128 and 255 throughout.
    for (e, blocks) in [(9_999, 6), (5_000, 4), (200, 2)] {
        let batch = stored_batch(1, &system[..blocks * B as usize], e as i64);
        assert_eq!(r.apply_kv_events(&addr(e), &batch).outcome.kind(), "applied");
    }
    let p = r.pick(&system, None).unwrap();
    assert_eq!((&*p.primary, p.cached_blocks), (addr(9_999).as_str(), 6));
    assert_eq!(
        p.fallbacks.iter().take(2).map(|f| f.to_string()).collect::<Vec<_>>(),
        vec![addr(5_000), addr(200)],
        "the next longest prefixes follow"
    );
    assert_eq!(p.fallbacks.len(), 3);
    drop(p);
    // 9,999 drops its last four blocks (engine hashes 9_999_002 to 005): 5,000 holds the most now.
    let dropped: Vec<i64> = (2..6).map(|k| 9_999_000 + k).collect();
    r.apply_kv_events(&addr(9_999), &removal_batch(2, Some(&dropped)));
    let p = r.pick(&system, None).unwrap();
    assert_eq!((&*p.primary, p.cached_blocks), (addr(5_000).as_str(), 4));
    drop(p);
    // 5,000's cache is cleared; 9,999 leaves the router: 200 is the last holder. Cleared and idle,
    // 5,000 is fresh: the whole prompt there (24 tokens at 0.25) waits less than 16 uncached tokens x 3
    // on 200, which is the first fallback.
    r.apply_kv_events(&addr(5_000), &removal_batch(2, None));
    r.set_endpoints((0..n - 1).map(|i| (addr(i), B)).collect()).unwrap();
    let p = r.pick(&system, None).unwrap();
    assert_eq!(
        (&*p.primary, p.cached_blocks, p.best_cached_blocks),
        (addr(5_000).as_str(), 0, 2)
    );
    assert_eq!(&*p.fallbacks[0], addr(200));
    assert_eq!(r.index_stats().event_blocks, 2);
}

#[test]
fn endpoint_changes_keep_survivors_and_forget_the_removed() {
    let r = router("kv_events", 3);
    let p = prompt(2, 3);
    r.apply_kv_events(&addr(1), &stored_batch(1, &p, 1));
    r.apply_kv_events(&addr(2), &stored_batch(1, &p, 2));
    r.set_health(&addr(1), false);
    r.set_endpoints(vec![(addr(0), B), (addr(1), B), (addr(5), B)]).unwrap();
    assert_eq!(
        r.index_stats().event_blocks,
        3,
        "endpoint 2's blocks shared with 1 stay for 1"
    );
    let infos = r.endpoints();
    assert_eq!(infos.len(), 3);
    assert!(
        !infos.iter().find(|e| *e.address == addr(1)).unwrap().healthy,
        "survivors keep their state"
    );
    r.set_endpoints(vec![(addr(0), B), (addr(5), B)]).unwrap();
    assert_eq!(r.index_stats().event_blocks, 0);
    r.set_endpoints(vec![(addr(0), B), (addr(5), B), (addr(1), B)]).unwrap();
    assert_eq!(
        r.pick(&p, None).unwrap().cached_blocks,
        0,
        "a re-added endpoint starts empty"
    );
    let too_many: Vec<_> = (0..=MAX_ENDPOINTS).map(|i| (format!("h{i}:1"), B)).collect();
    assert!(matches!(
        r.set_endpoints(too_many),
        Err(RoutingError::TooManyEndpoints { .. })
    ));
}

#[test]
fn picks_run_while_events_are_applied() {
    let r = Arc::new(router("kv_events", 8));
    let p = prompt(1, 8);
    r.apply_kv_events(&addr(3), &stored_batch(1, &p, 1));
    let writer = {
        let r = r.clone();
        std::thread::spawn(move || {
            for i in 0..3500u64 {
                let e = [0, 1, 2, 4, 5, 6, 7][(i % 7) as usize];
                let t = prompt(i as u32 + 100, 4);
                assert_eq!(
                    r.apply_kv_events(&addr(e), &stored_batch(i / 7 + 1, &t, i as i64))
                        .outcome
                        .kind(),
                    "applied"
                );
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let r = r.clone();
            let p = p.clone();
            std::thread::spawn(move || {
                for _ in 0..3000 {
                    let pick = r.pick(&p, None).unwrap();
                    assert_eq!((&*pick.primary, pick.cached_blocks), (addr(3).as_str(), 8));
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for t in readers {
        t.join().unwrap();
    }
}

#[test]
fn shedding_refuses_only_when_every_queue_is_full() {
    let cfg = RouterConfig {
        seed: Some(1),
        shed_queue_depth: 2,
        default_priority: -1,
        ..Default::default()
    };
    let r = router_with("least_load", 2, cfg);
    let tokens = prompt(1, 2);
    let req = PickRequest {
        token_ids: &tokens,
        ..Default::default()
    };
    // With no engine reports, requests in flight count as queued: two each fill both queues.
    let held: Vec<Pick> = (0..4).map(|_| r.route(&req).unwrap()).collect();
    assert_eq!(r.route(&req).unwrap_err(), NoRoute::Overloaded);
    drop(held);
    assert!(r.route(&req).is_ok());
    // An engine that reports running them has no queue: nothing is shed.
    for i in 0..2 {
        r.set_engine_load(
            &addr(i),
            None,
            &EngineLoad {
                running: 8,
                max_running: 8,
                ..Default::default()
            },
        );
    }
    let _held: Vec<Pick> = (0..6).map(|_| r.route(&req).unwrap()).collect();
    // No healthy endpoint is a different reason.
    for i in 0..2 {
        r.set_health(&addr(i), false);
    }
    assert_eq!(r.route(&req).unwrap_err(), NoRoute::NoEndpoint);
}

#[test]
fn only_requests_of_negative_priority_are_shed() {
    let cfg = RouterConfig {
        seed: Some(1),
        shed_queue_depth: 2,
        objectives: [("batch", -1), ("chat", 10), ("standard", 0), ("high", 5)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ..Default::default()
    };
    let r = router_with("least_load", 2, cfg);
    let tokens = prompt(1, 2);
    let of = |objective: Option<&'static str>| PickRequest {
        token_ids: &tokens,
        objective,
        ..Default::default()
    };
    assert_eq!(r.priority(Some("batch")), -1);
    assert_eq!(r.priority(Some("high")), 5);
    assert_eq!(
        r.priority(Some("unknown")),
        0,
        "an unknown objective has the default priority"
    );
    assert_eq!(r.priority(None), 0);
    // Below the depth, a sheddable request is routed like any other.
    let mut held: Vec<Pick> = (0..3).map(|_| r.route(&of(Some("batch"))).unwrap()).collect();
    // Every queue full (two in flight each, no engine report): only the negative priority is shed.
    held.push(r.route(&of(Some("chat"))).unwrap());
    assert_eq!(r.route(&of(Some("batch"))).unwrap_err(), NoRoute::Overloaded);
    for objective in [None, Some("standard"), Some("high"), Some("chat"), Some("unknown")] {
        held.push(
            r.route(&of(objective))
                .unwrap_or_else(|e| panic!("{objective:?}: {e:?}")),
        );
    }
    assert_eq!(r.route(&of(Some("batch"))).unwrap_err(), NoRoute::Overloaded);
    // The queues drain: served again.
    held.clear();
    assert!(r.route(&of(Some("batch"))).is_ok());
    // A default priority of -1 makes requests without a known objective sheddable too.
    let cfg = RouterConfig {
        seed: Some(1),
        shed_queue_depth: 1,
        default_priority: -1,
        objectives: [("chat".to_string(), 0)].into_iter().collect(),
        ..Default::default()
    };
    let r = router_with("least_load", 1, cfg);
    let _held = r.route(&of(None)).unwrap();
    assert_eq!(r.route(&of(None)).unwrap_err(), NoRoute::Overloaded);
    assert_eq!(r.route(&of(Some("unknown"))).unwrap_err(), NoRoute::Overloaded);
    assert!(r.route(&of(Some("chat"))).is_ok());
    // Shedding off (depth 0): nothing is shed, whatever the priority.
    let r = router_with(
        "least_load",
        1,
        RouterConfig {
            default_priority: -1,
            ..Default::default()
        },
    );
    let _held: Vec<Pick> = (0..5).map(|_| r.route(&of(None)).unwrap()).collect();
}

// ---- Data-parallel ranks: one endpoint per rank, `"{address}#{rank}"`.

/// `addr(i)`'s rank `rank` as the router names it.
fn rank(i: usize, rank: u32) -> String {
    format!("{}#{rank}", addr(i))
}

/// A router over engines of the given DP sizes (`addr(i)` has `sizes[i]` ranks).
fn dp_router(policy: &str, sizes: &[u32], max_fallbacks: usize) -> Router {
    let r = Router::new(
        policy,
        RouterConfig {
            seed: Some(3),
            max_fallbacks,
            ..Default::default()
        },
    )
    .unwrap();
    let names = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| crate::routing::endpoint::engine_endpoint_names(&addr(i), n))
        .map(|name| (name, B))
        .collect();
    r.set_endpoints(names).unwrap();
    r
}

/// `batch` with its `dp_rank` set.
fn on_rank(batch: Vec<u8>, dp_rank: Option<i32>) -> Vec<u8> {
    let mut b = pb::KvEventBatch::decode(batch.as_slice()).unwrap();
    b.dp_rank = dp_rank;
    b.encode_to_vec()
}

/// The router's view of the endpoint of that name.
fn endpoint(r: &Router, name: &str) -> EndpointInfo {
    r.endpoints()
        .into_iter()
        .find(|e| &*e.address == name)
        .unwrap_or_else(|| panic!("no endpoint {name}"))
}

fn engine_blocks(r: &Router, name: &str) -> usize {
    endpoint(r, name).engine_blocks
}

/// The running requests an endpoint's engine last reported.
fn running(r: &Router, name: &str) -> u32 {
    endpoint(r, name).load.engine.running
}

#[test]
fn a_batch_goes_to_the_rank_it_names_and_picks_follow_it() {
    let r = dp_router("kv_events", &[2, 1], 0);
    let p = prompt(4, 5);
    let batch = on_rank(stored_batch(1, &p, 1), Some(1));
    assert_eq!(r.apply_kv_events(&addr(0), &batch).outcome.kind(), "applied");
    assert_eq!(engine_blocks(&r, &rank(0, 1)), 5);
    assert_eq!(engine_blocks(&r, &rank(0, 0)), 0, "rank 0 holds nothing");
    let pick = r.pick(&p, None).unwrap();
    assert_eq!(&*pick.primary, rank(0, 1));
    assert_eq!((pick.address(), pick.rank()), (addr(0).as_str(), Some(1)));
    assert_eq!(pick.cached_blocks, 5);
    // Each rank numbers its own batches: rank 0's first batch is no gap after rank 1's.
    let other = prompt(5, 3);
    assert_eq!(
        r.apply_kv_events(&addr(0), &on_rank(stored_batch(1, &other, 2), Some(0)))
            .outcome
            .kind(),
        "applied"
    );
    assert_eq!(&*r.pick(&other, None).unwrap().primary, rank(0, 0));
    // A rank the engine does not have is an unknown endpoint (resubscribe).
    assert_eq!(
        r.apply_kv_events(&addr(0), &on_rank(stored_batch(2, &p, 1), Some(2)))
            .outcome,
        EventOutcome::UnknownEndpoint
    );
}

#[test]
fn a_batch_without_a_rank_goes_to_rank_0_and_its_load_with_it() {
    let r = dp_router("kv_events", &[2], 0);
    let p = prompt(6, 3);
    let mut batch = pb::KvEventBatch::decode(stored_batch(1, &p, 1).as_slice()).unwrap();
    batch.load = Some(pb::EngineLoad {
        running_requests: 7,
        ..Default::default()
    });
    let res = r.apply_kv_events(&addr(0), &batch.encode_to_vec());
    assert_eq!(res.outcome.kind(), "applied");
    assert_eq!(engine_blocks(&r, &rank(0, 0)), 3);
    assert_eq!(engine_blocks(&r, &rank(0, 1)), 0);
    assert_eq!((running(&r, &rank(0, 0)), running(&r, &rank(0, 1))), (7, 0));
    // A one-rank engine takes its batches whatever rank they name.
    let r = dp_router("kv_events", &[1], 0);
    let batch = on_rank(stored_batch(1, &p, 1), Some(0));
    assert_eq!(r.apply_kv_events(&addr(0), &batch).outcome.kind(), "applied");
    assert_eq!(engine_blocks(&r, &addr(0)), 3);
}

#[test]
fn health_resets_and_loads_by_address_cover_the_ranks() {
    let r = dp_router("round_robin", &[3, 1], 0);
    assert!(r.set_health(&addr(0), false));
    for _ in 0..6 {
        assert_eq!(&*r.pick(&[1], None).unwrap().primary, addr(1));
    }
    assert!(r.set_health(&addr(0), true));
    assert!(r.set_health(&addr(1), false));
    let picked: std::collections::BTreeSet<String> = (0..9)
        .map(|_| r.pick(&[1], None).unwrap().primary.to_string())
        .collect();
    assert_eq!(
        picked,
        [rank(0, 0), rank(0, 1), rank(0, 2)].into_iter().collect(),
        "every rank is back"
    );
    assert!(!r.set_health("10.9.9.9:1", false));

    let r = dp_router("kv_events", &[2], 0);
    let p = prompt(2, 3);
    for k in 0..2 {
        r.apply_kv_events(&addr(0), &on_rank(stored_batch(1, &p, k + 1), Some(k as i32)));
    }
    assert_eq!((engine_blocks(&r, &rank(0, 0)), engine_blocks(&r, &rank(0, 1))), (3, 3));
    assert!(r.reset_kv_events(&addr(0)));
    assert_eq!((engine_blocks(&r, &rank(0, 0)), engine_blocks(&r, &rank(0, 1))), (0, 0));
    assert_eq!(r.index_stats().event_blocks, 0);

    let load = EngineLoad {
        running: 4,
        ..Default::default()
    };
    assert!(r.set_engine_load(&addr(0), Some(1), &load));
    assert!(!r.set_engine_load(&addr(0), Some(2), &load), "no rank 2");
    assert_eq!((running(&r, &rank(0, 0)), running(&r, &rank(0, 1))), (0, 4));
}

#[test]
fn fallbacks_are_other_engines_addresses_with_the_pinned_rank() {
    // least_load: every request held makes its endpoint rank last; the spread decides the order.
    let r = dp_router("least_load", &[2, 2, 1, 2], 5);
    let hold = |name: &str, n: usize| -> Vec<InFlight> {
        let (address, rank) = crate::routing::endpoint::split_name(name);
        (0..n).map(|_| r.begin(address, rank, 0).unwrap()).collect()
    };
    // addr(0)#1 is the least loaded, then addr(0)#0, addr(1)#1, addr(2), addr(3)#1, addr(1)#0, addr(3)#0.
    let _held: Vec<InFlight> = [
        (rank(0, 0), 1),
        (rank(1, 1), 2),
        (addr(2), 3),
        (rank(3, 1), 4),
        (rank(1, 0), 5),
        (rank(3, 0), 6),
    ]
    .iter()
    .flat_map(|(name, n)| hold(name, *n))
    .collect();
    let p = r.pick(&[], None).unwrap();
    assert_eq!(&*p.primary, rank(0, 1));
    let fallbacks: Vec<String> = p.fallbacks.iter().map(|f| f.to_string()).collect();
    assert_eq!(
        fallbacks,
        vec![addr(1), addr(3)],
        "each other engine once, not the primary's, only engines with rank 1"
    );
    assert!(fallbacks.iter().all(|f| !f.contains('#')));
    drop(p);

    // A primary of one rank (no pin): every other engine, each once, at its best rank.
    let r = dp_router("least_load", &[1, 2, 2], 5);
    let _held: Vec<InFlight> = [(rank(1, 0), 3), (rank(1, 1), 4), (rank(2, 0), 1), (rank(2, 1), 5)]
        .iter()
        .flat_map(|(name, n)| {
            let (address, rank) = crate::routing::endpoint::split_name(name);
            (0..*n).map(move |_| (address.to_string(), rank)).collect::<Vec<_>>()
        })
        .map(|(address, rank)| r.begin(&address, rank, 0).unwrap())
        .collect();
    let p = r.pick(&[], None).unwrap();
    assert_eq!((&*p.primary, p.rank()), (addr(0).as_str(), None));
    assert_eq!(
        p.fallbacks.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        vec![addr(2), addr(1)]
    );
}

#[test]
fn a_subset_hint_of_addresses_admits_the_ranks() {
    let r = dp_router("round_robin", &[2, 2], 0);
    let subset = [addr(1)];
    let subset: Vec<&str> = subset.iter().map(String::as_str).collect();
    let picked: std::collections::BTreeSet<String> = (0..6)
        .map(|_| {
            r.pick_with(&PickRequest {
                token_ids: &[1],
                subset: Some(&subset),
                ..Default::default()
            })
            .unwrap()
            .primary
            .to_string()
        })
        .collect();
    assert_eq!(picked, [rank(1, 0), rank(1, 1)].into_iter().collect());
}

#[test]
fn a_fallback_counts_the_request_on_its_pinned_rank_or_rank_0() {
    let r = dp_router("least_load", &[2, 1], 0);
    let in_flight = |name: &str| {
        r.endpoints()
            .iter()
            .find(|e| &*e.address == name)
            .unwrap()
            .load
            .in_flight_requests
    };
    let a = r.begin(&addr(0), Some(1), 10).unwrap();
    assert_eq!((in_flight(&rank(0, 0)), in_flight(&rank(0, 1))), (0, 1));
    let b = r.begin(&addr(0), Some(7), 10).unwrap();
    assert_eq!(in_flight(&rank(0, 0)), 1, "no rank 7: rank 0");
    let c = r.begin(&addr(1), Some(1), 10).unwrap();
    assert_eq!(in_flight(&addr(1)), 1, "a one-rank engine takes it whole");
    assert!(r.begin("10.9.9.9:1", None, 1).is_none());
    drop((a, b, c));
}

// The router's own view of failures (`penalty.rs`): what streams report steers the picks.

#[test]
fn a_failing_endpoint_is_not_picked_while_another_is_not_ejected() {
    let r = router("least_load", 2);
    assert!(r.report(&addr(0), None, Err(Failure::Down)));
    // addr(0) holds no requests and would win every least-load pick; ejected, it wins none.
    let picks: Vec<Pick> = (0..20).map(|_| r.pick(&[1, 2, 3], None).unwrap()).collect();
    assert!(picks.iter().all(|p| *p.primary == *addr(1)));
    assert!(
        picks.iter().all(|p| p.fallbacks.is_empty()),
        "an ejected engine is no fallback either"
    );
    assert_eq!(endpoint(&r, &addr(0)).standing, Standing::Ejected);
    assert!(!r.report("10.9.9.9:1", None, Err(Failure::Down)), "unknown endpoint");
}

#[test]
fn with_every_endpoint_ejected_picks_still_go_somewhere() {
    let r = router("least_load", 2);
    r.report(&addr(0), None, Err(Failure::Down));
    r.report(&addr(1), None, Err(Failure::Busy));
    let pick = r
        .pick(&[1, 2, 3], None)
        .expect("a failing engine is better than a certain 503");
    assert_eq!(pick.fallbacks.len(), 1);
}

#[test]
fn a_busy_endpoint_gets_one_probe_after_its_backoff_and_a_success_closes_it() {
    let r = router("least_load", 2);
    let _busy_elsewhere = r.pick(&[1], None).unwrap(); // one request on either endpoint
    let other = r
        .endpoints()
        .into_iter()
        .find(|e| e.load.in_flight_requests == 0)
        .unwrap()
        .address;
    r.report(&other, None, Err(Failure::Busy));
    assert!(
        r.pick(&[1], None).is_some_and(|p| p.primary != other),
        "ejected for 250 ms"
    );
    std::thread::sleep(Backoff::BUSY.after(1) + std::time::Duration::from_millis(20));
    let probe = r.pick(&[1], None).unwrap();
    assert_eq!(
        probe.primary, other,
        "the half-open endpoint is the least loaded: it is probed"
    );
    let while_probing = r.pick(&[1], None).unwrap();
    assert_ne!(while_probing.primary, other, "one probe at a time");
    drop(while_probing);
    drop(probe); // the probe ended without an outcome (its client went away): the slot frees
    let probe = r.pick(&[1], None).unwrap();
    assert_eq!(probe.primary, other);
    r.report(&other, None, Ok(()));
    assert_eq!(endpoint(&r, &other).standing, Standing::Closed);
    assert_eq!(
        r.pick(&[1], None).unwrap().primary,
        other,
        "closed again: picked by load alone"
    );
}

#[test]
fn reports_reach_the_rank_of_a_data_parallel_engine() {
    let r = dp_router("least_load", &[2, 1], 1);
    assert!(r.report(&addr(0), Some(1), Err(Failure::Down)));
    assert_eq!(endpoint(&r, &rank(0, 1)).standing, Standing::Ejected);
    assert_eq!(endpoint(&r, &rank(0, 0)).standing, Standing::Closed);
    for _ in 0..6 {
        let pick = r.pick(&[1], None).unwrap();
        assert_ne!(&*pick.primary, rank(0, 1));
    }
}

#[test]
fn booking_counts_a_just_routed_prefix_before_its_events() {
    // Two idle endpoints; a 30-block prompt goes to one of them and reaches its first token (no
    // prefill backlog left), but no KV event has told us yet what that engine now holds.
    let shared = prompt(5, 30);
    let mut follow_up = shared.clone();
    follow_up.extend([1, 1, 1, 1]);
    let second_pick = |book_routed_s: f64| {
        let r = router_with(
            "kv_events",
            2,
            RouterConfig {
                seed: Some(1),
                book_routed_s,
                // Off: a cold prompt's own booking would count it on the first endpoint too.
                book_cold_s: 0.0,
                ..Default::default()
            },
        );
        let mut first = r.pick(&shared, None).unwrap();
        first.in_flight.first_token();
        let second = r.pick(&follow_up, None).unwrap();
        (first.primary.clone(), second.primary.clone(), second.cached_blocks)
    };
    // Without booking both look cold and the first endpoint has a request more: the follow-up goes
    // to the other one and prefills the whole prefix again.
    let (first, second, cached) = second_pick(0.0);
    assert_ne!(first, second);
    assert_eq!(cached, 0);
    // Booked, the prefix counts on the first endpoint: the follow-up joins it.
    let (first, second, cached) = second_pick(5.0);
    assert_eq!(first, second);
    assert_eq!(cached, 30);
}

#[test]
fn a_session_turn_follows_its_previous_turn_before_its_events() {
    // A session's first turn (held nowhere) is routed and still prefilling when its next turn arrives,
    // before any event. The session's booking sends the next turn after it; another session's request
    // with the same prompt, or one without a key, does not see the booking.
    let turn = prompt(5, 16);
    let mut next = turn.clone();
    next.extend(prompt(6, 2));
    let picks = |book_session_s: f64, next_session: Option<&str>| {
        let r = router_with(
            "kv_events",
            2,
            RouterConfig {
                seed: Some(1),
                book_session_s,
                // Off: the first turn's prompt is cold, and its cold booking is seen by every request.
                book_cold_s: 0.0,
                ..Default::default()
            },
        );
        served(&r);
        let first = r.pick(&turn, Some("session-a")).unwrap();
        let second = r.pick(&next, next_session).unwrap();
        (first.primary.clone(), second.primary.clone(), second.cached_blocks)
    };
    // Unbooked, the next turn sees nothing anywhere and goes to the idle engine.
    let (first, second, cached) = picks(0.0, Some("session-a"));
    assert_ne!(first, second);
    assert_eq!(cached, 0);
    // Booked: it follows, counting the first turn's 16 blocks there.
    let (first, second, cached) = picks(5.0, Some("session-a"));
    assert_eq!(first, second);
    assert_eq!(cached, 16);
    for other in [Some("session-b"), None] {
        let (first, second, cached) = picks(5.0, other);
        assert_ne!(first, second, "{other:?}");
        assert_eq!(cached, 0);
    }
}

#[test]
fn cold_booking_keeps_a_burst_of_a_new_prefix_on_as_many_engines_as_asked() {
    // Four idle endpoints, a burst of four requests sharing a 30-block prompt that no engine's events
    // show yet (the first is still prefilling when the rest arrive).
    let shared = prompt(5, 30);
    let burst = |book_cold_s: f64, book_cold_spread: u32, book_cold_spread_share: f64| {
        let r = router_with(
            "kv_events",
            4,
            RouterConfig {
                seed: Some(1),
                book_cold_s,
                book_cold_spread,
                book_cold_spread_share,
                ..Default::default()
            },
        );
        served(&r);
        let picks: Vec<Pick> = (0..4)
            .map(|i| {
                let mut request = shared.clone();
                request.extend([900 + i; 4]);
                r.pick(&request, None).unwrap()
            })
            .collect();
        picks
            .iter()
            .map(|p| p.primary.to_string())
            .collect::<BTreeSet<_>>()
            .len()
    };
    // Without the booking each looks cold and goes to the least loaded: the prefix is prefilled four
    // times. Booked, the first engine's 30 blocks outweigh a request or three ahead there.
    assert_eq!(burst(0.0, 1, 0.0), 4);
    assert_eq!(burst(2.0, 1, 0.0), 1);
    // Spread over two: the second request goes to another engine, the rest join one of the two.
    assert_eq!(burst(2.0, 2, 0.0), 2);
    // As a share of the four healthy endpoints, rounded up; the larger of the count and the share.
    assert_eq!(burst(2.0, 1, 0.5), 2);
    assert_eq!(burst(2.0, 1, 0.6), 3);
    assert_eq!(burst(2.0, 3, 0.25), 3);
    assert_eq!(burst(2.0, 1, 1.0), 4);
    // The default: booked for 2 s over half the pool, at least two engines.
    let d = RouterConfig::default();
    assert_eq!(burst(d.book_cold_s, d.book_cold_spread, d.book_cold_spread_share), 2);
    assert!(RouterConfig::from_json(r#"{"book_cold_spread": 0}"#).is_err());
    assert!(RouterConfig::from_json(r#"{"book_cold_spread_share": 1.5}"#).is_err());
    assert!(RouterConfig::from_json(r#"{"book_cold_spread_share": -0.1}"#).is_err());
    assert_eq!(d.book_cold_spread, 2);
    assert_eq!(d.book_cold_spread_share, 0.5);
}

#[test]
fn cold_booking_leaves_a_prompt_the_events_show_to_the_events() {
    // Endpoint 2's events hold the prompt's first 10 blocks. A request for it is not cold: it is not
    // booked, so a second request with a longer shared part still sees only what the events say.
    let r = router_with(
        "kv_events",
        2,
        RouterConfig {
            seed: Some(1),
            book_cold_s: 5.0,
            ..Default::default()
        },
    );
    served(&r);
    let shared = prompt(5, 30);
    assert_eq!(
        r.apply_kv_events(&addr(1), &stored_batch(1, &shared[..10 * B as usize], 1))
            .outcome
            .kind(),
        "applied"
    );
    let mut first = r.pick(&shared, None).unwrap();
    assert_eq!((&*first.primary, first.cached_blocks), (addr(1).as_str(), 10));
    first.in_flight.first_token();
    drop(first);
    let second = r.pick(&shared, None).unwrap();
    assert_eq!(second.cached_blocks, 10, "nothing booked beyond what the events show");
    assert!(RouterConfig::from_json(r#"{"book_cold_s": -1}"#).is_err());
    assert_eq!(RouterConfig::default().book_cold_s, 2.0);
}

#[test]
fn booking_is_refused_when_negative() {
    assert!(RouterConfig::from_json(r#"{"book_routed_s": -1}"#).is_err());
    assert_eq!(RouterConfig::default().book_routed_s, 0.0, "off unless asked for");
}

#[test]
fn resident_sessions_spread_new_sessions_and_leave_follow_ups_to_their_history() {
    // Endpoint 0 holds a 10-block preamble; each session's first prompt is the preamble plus two
    // blocks of its own (8 uncached tokens there, 48 on endpoint 1), then a follow-up re-sends it plus
    // two blocks. Requests finish at once, so the loads say nothing: only the sessions resident on
    // endpoint 0 (those that came back) can send a new one elsewhere.
    let route = |cost: u32| {
        let r = router_with(
            "kv_events",
            2,
            RouterConfig {
                seed: Some(3),
                resident_session_tokens: cost,
                ..Default::default()
            },
        );
        served(&r);
        let mut seq = [0u64; 2];
        let mut store = |endpoint: usize, tokens: &[u32]| {
            seq[endpoint] += 1;
            let batch = stored_batch(seq[endpoint], tokens, seq[endpoint] as i64);
            assert_eq!(r.apply_kv_events(&addr(endpoint), &batch).outcome.kind(), "applied");
        };
        let preamble = prompt(1, 10);
        store(0, &preamble);
        let (mut firsts, mut follow_ups) = (Vec::new(), Vec::new());
        for s in 0..5 {
            let key = format!("session-{s}");
            let first = [preamble.clone(), prompt(10 + s, 2)].concat();
            let at = r.pick(&first, Some(&key)).unwrap().primary.to_string();
            store(if at == addr(0) { 0 } else { 1 }, &first);
            let follow_up = [first, prompt(30 + s, 2)].concat();
            follow_ups.push(r.pick(&follow_up, Some(&key)).unwrap().primary.to_string());
            firsts.push(at);
        }
        (firsts, follow_ups)
    };
    // Off: every session joins the preamble's holder.
    let (firsts, follow_ups) = route(0);
    assert_eq!(firsts, vec![addr(0); 5]);
    assert_eq!(follow_ups, firsts);
    // 50 tokens per resident session: with three there (24 + 150 > 144), the fourth session starts on
    // endpoint 1 and prefills the preamble there; the fifth finds it on both (endpoint 0: 24 + 150,
    // endpoint 1: 24 + 50). Follow-ups are not priced: each stays with its history.
    let (firsts, follow_ups) = route(50);
    assert_eq!(firsts, vec![addr(0), addr(0), addr(0), addr(1), addr(1)]);
    assert_eq!(follow_ups, firsts);
    assert!(RouterConfig::from_json(r#"{"resident_window_s": 0}"#).is_err());
    assert_eq!(
        RouterConfig::default().resident_session_tokens,
        0,
        "off unless asked for"
    );
}

#[test]
fn a_fresh_engine_takes_a_busy_holders_request_once_and_then_holds_something() {
    // Endpoint 0 holds a 10-block preamble and runs 3 requests (48 tokens of load); endpoint 1 published
    // another prompt and is idle; endpoint 2 was never routed to and published nothing: fresh. A new
    // session (the preamble + 2 blocks: 8 uncached tokens on 0, 48 elsewhere) waits 48 + 3 x 8 = 72 on
    // endpoint 0, 3 x 48 = 144 on endpoint 1, and at the fresh weight 0 nothing on endpoint 2.
    let route = |fresh_cache_weight: Option<f64>| {
        let r = router_with(
            "kv_events",
            3,
            RouterConfig {
                seed: Some(5),
                fresh_cache_weight,
                ..Default::default()
            },
        );
        let preamble = prompt(1, 10);
        let mut holder = pb::KvEventBatch::decode(&stored_batch(0, &preamble, 1)[..]).unwrap();
        holder.load = Some(pb::EngineLoad {
            running_requests: 3,
            ..Default::default()
        });
        assert_eq!(
            r.apply_kv_events(&addr(0), &holder.encode_to_vec()).outcome.kind(),
            "applied"
        );
        let other = stored_batch(0, &prompt(2, 10), 2);
        assert_eq!(r.apply_kv_events(&addr(1), &other).outcome.kind(), "applied");
        let session = |s: u32| [preamble.clone(), prompt(10 + s, 2)].concat();
        let first = r.pick(&session(0), None).unwrap().primary.to_string();
        let second = r.pick(&session(1), None).unwrap().primary.to_string();
        (first, second)
    };
    assert_eq!(route(None), (addr(0), addr(0)), "off: the holder keeps the preamble");
    // On: the fresh engine takes the first; routed once and with no events yet it is fresh no more,
    // so the second goes back to the holder rather than to a copy still being prefilled.
    assert_eq!(route(Some(0.0)), (addr(2), addr(0)));
    // The default, 0.25: 12 on the fresh engine against 72.
    assert_eq!(RouterConfig::default().fresh_cache_weight, Some(0.25));
    assert_eq!(route(RouterConfig::default().fresh_cache_weight), (addr(2), addr(0)));
    assert!(RouterConfig::from_json(r#"{"fresh_cache_weight": -1}"#).is_err());
    assert_eq!(
        RouterConfig::from_json(r#"{"fresh_cache_weight": null}"#)
            .unwrap()
            .fresh_cache_weight,
        None,
        "null turns it off"
    );
}

#[test]
fn a_prompt_shorter_than_a_block_leaves_its_engine_fresh() {
    // A readiness probe caches no full block, so its engine publishes no Stored event: it is as new as
    // before. A prompt of one block or more may be cached there, and until its events say what the
    // engine holds, it is fresh no more.
    let r = router("kv_events", 1);
    let st = r.read_table().get(&addr(0)).unwrap().clone();
    let idle = Load::default();
    drop(r.pick(&vec![7; B as usize - 1], None).unwrap());
    assert!(st.fresh(&idle), "a probe cached nothing");
    drop(r.pick(&prompt(1, 1), None).unwrap());
    assert!(!st.fresh(&idle), "a full block may be cached there");
}

#[test]
fn a_fallback_that_answered_is_fresh_no_more_after_a_full_block() {
    // Envoy sent the request to a fallback (`Router::begin`): the prompt is prefilled there as on a
    // primary. An engine that publishes no events is fresh only until it was sent a full block, by
    // either path; a probe shorter than a block leaves it fresh.
    let r = router("kv_events", 2);
    let st = r.read_table().get(&addr(1)).unwrap().clone();
    let idle = Load::default();
    drop(r.begin(&addr(1), None, u64::from(B) - 1).unwrap());
    assert!(st.fresh(&idle), "a probe cached nothing");
    assert!(endpoint(&r, &addr(1)).nothing_cached, "as operators see it");
    drop(r.begin(&addr(1), None, u64::from(B)).unwrap());
    assert!(!st.fresh(&idle), "a full block may be cached there");
    assert!(!endpoint(&r, &addr(1)).nothing_cached);
}

#[test]
fn an_engine_that_publishes_is_fresh_while_its_events_show_nothing() {
    let r = router("kv_events", 1);
    let st = r.read_table().get(&addr(0)).unwrap().clone();
    let idle = Load::default();
    assert!(st.fresh(&idle), "new");
    st.mark_routed();
    assert!(!st.fresh(&idle), "routed to, and no events to say what it holds");
    // Its first batch (nothing stored): it publishes, so its events speak for it.
    let empty = pb::KvEventBatch::default().encode_to_vec();
    assert_eq!(r.apply_kv_events(&addr(0), &empty).outcome.kind(), "applied");
    assert!(st.fresh(&idle));
    let busy = r.begin(&addr(0), None, 8).unwrap();
    assert!(!st.fresh(&st.load()), "a request on it");
    drop(busy);
    assert_eq!(
        r.apply_kv_events(&addr(0), &stored_batch(1, &prompt(1, 2), 1))
            .outcome
            .kind(),
        "applied"
    );
    assert!(!st.fresh(&idle), "a block cached");
    // Cleared (a restarted engine): fresh again; so after a resubscription's reset.
    assert_eq!(
        r.apply_kv_events(&addr(0), &removal_batch(2, None)).outcome.kind(),
        "applied"
    );
    assert!(st.fresh(&idle));
    assert_eq!(
        r.apply_kv_events(&addr(0), &stored_batch(3, &prompt(1, 2), 1))
            .outcome
            .kind(),
        "applied"
    );
    assert!(r.reset_kv_events(&addr(0)));
    assert!(st.fresh(&idle));
}

/// Three endpoints: 0 holds a preamble of `preamble_blocks` blocks, 1 and 2 hold other prompts (none is
/// fresh). Returns the router and the preamble.
fn preamble_on_0(cfg: RouterConfig, preamble_blocks: u32) -> (Router, Vec<u32>) {
    let r = router_with("kv_events", 3, cfg);
    let preamble = prompt(1, preamble_blocks);
    for (i, p) in [(0, &preamble), (1, &prompt(2, 10)), (2, &prompt(3, 10))] {
        let batch = stored_batch(0, p, i as i64 + 1);
        assert_eq!(r.apply_kv_events(&addr(i), &batch).outcome.kind(), "applied");
    }
    (r, preamble)
}

/// `n` requests sent to endpoint `i` lately, each ended, for each `(i, n)`: the recent requests that
/// `underused_share` and `busy_miss_weight` count.
fn sent_lately(r: &Router, sent: &[(usize, usize)]) {
    for &(i, n) in sent {
        for _ in 0..n {
            drop(r.begin(&addr(i), None, 8).unwrap());
        }
    }
}

#[test]
fn an_underused_engine_takes_new_requests_and_follow_ups_keep_their_history() {
    // Endpoint 0 holds a 10-block preamble; endpoints 1 and 2 hold other prompts (not fresh). Lately 0
    // was sent 7 requests, 1 three, 2 none: mean 3.3, and 2 is under half of it. A new session on the
    // preamble waits 3 x 8 uncached tokens on idle 0 and 3 x 48 elsewhere; underused, 2 prices its
    // uncached tokens at 0. A follow-up of a session booked on 0 stays there.
    let route = |underused_share: f64| {
        let (r, preamble) = preamble_on_0(
            RouterConfig {
                seed: Some(5),
                underused_share,
                ..Default::default()
            },
            10,
        );
        let turn = |s: u32, blocks: u32| [preamble.clone(), prompt(10 + s, blocks)].concat();
        // Session "s" starts before any imbalance (mean under 2): the holder takes it.
        let first = r.pick(&turn(0, 2), Some("s")).unwrap().primary.to_string();
        sent_lately(&r, &[(0, 6), (1, 3)]);
        let follow_up = r.pick(&turn(0, 4), Some("s")).unwrap().primary.to_string();
        let new = r.pick(&turn(1, 2), Some("t")).unwrap().primary.to_string();
        (first, follow_up, new)
    };
    assert_eq!(
        route(0.0),
        (addr(0), addr(0), addr(0)),
        "off: the holder keeps the preamble"
    );
    assert_eq!(route(0.5), (addr(0), addr(0), addr(2)));
    // At a share of 0.25 (0.83) nobody is under it but the idle engine 2, still; at 0 it is off.
    assert_eq!(route(0.25).2, addr(2));
    assert!(RouterConfig::from_json(r#"{"underused_share": 1.5}"#).is_err());
    assert!(RouterConfig::from_json(r#"{"demand_window_s": 0}"#).is_err());
    assert_eq!(RouterConfig::default().underused_share, 0.0);
}

#[test]
fn an_engine_leaving_the_pool_takes_its_requests_out_of_the_mean() {
    // Lately 0 was sent 12 requests, 1 two and 2 four: mean 6, and 1 is under half of it. With 0
    // unhealthy or removed, its requests leave the pool's count with it: mean 3, and none is.
    let r = router_with(
        "kv_events",
        3,
        RouterConfig {
            seed: Some(5),
            underused_share: 0.5,
            ..Default::default()
        },
    );
    sent_lately(&r, &[(0, 12), (1, 2), (2, 4)]);
    let underused = |r: &Router| -> Vec<String> {
        let t = prompt(1, 4);
        let req = PickRequest {
            token_ids: &t,
            ..Default::default()
        };
        let table = r.read_table();
        let d = r.rank_all(&table, &req, std::time::Instant::now(), r.now()).unwrap();
        let mut names: Vec<String> = (0..d.candidates.len())
            .filter(|&i| d.candidates[i].underused)
            .map(|i| d.states[i].address.to_string())
            .collect();
        names.sort();
        names
    };
    assert_eq!(underused(&r), [addr(1)]);
    r.set_health(&addr(0), false);
    assert_eq!(underused(&r), Vec::<String>::new());
    // A repeated report takes nothing more out; back in the pool, its requests count again.
    r.set_health(&addr(0), false);
    r.set_health(&addr(0), true);
    assert_eq!(underused(&r), [addr(1)]);
    r.set_endpoints(vec![(addr(1), B), (addr(2), B)]).unwrap();
    assert_eq!(underused(&r), Vec::<String>::new());
}

#[test]
fn a_miss_leaves_a_busy_holder_and_its_hits_stay() {
    // Endpoint 0 holds a 30-block preamble; 1 and 2 hold other prompts (not fresh). Lately 0 was sent 9
    // requests, 1 and 2 three each: mean 5, and 0 is busy by 0.8 of it. 0 has nothing on it, 1 and 2 a
    // request each with 64 tokens to prefill: a wait of 80. A new prompt of 160 tokens cached nowhere
    // waits 3 x 160 = 480 on 0 and 80 + 480 on the others; busy (weight 3), 0 adds 3 x 0.8 x 160 = 384.
    // A question after the preamble (8 uncached tokens on 0) stays: 0 holds part of it, so only 3 x 8
    // there (a whole miss only is priced), 80 + 3 x 128 elsewhere.
    let route = |busy_miss_weight: f64, sent: bool| {
        let (r, preamble) = preamble_on_0(
            RouterConfig {
                seed: Some(5),
                busy_miss_weight,
                ..Default::default()
            },
            30,
        );
        if sent {
            sent_lately(&r, &[(0, 9), (1, 2), (2, 2)]);
        }
        let _backlog: Vec<InFlight> = (1..3).map(|i| r.begin(&addr(i), None, 64).unwrap()).collect();
        let miss = r.pick(&prompt(20, 40), None).unwrap().primary.to_string();
        let hit = r
            .pick(&[preamble.clone(), prompt(21, 2)].concat(), None)
            .unwrap()
            .primary
            .to_string();
        (miss, hit)
    };
    assert_eq!(
        route(0.0, true),
        (addr(0), addr(0)),
        "off: the idle holder takes the miss"
    );
    let (miss, hit) = route(3.0, true);
    assert_ne!(miss, addr(0), "the miss leaves the busy holder");
    assert_eq!(hit, addr(0), "the hit stays on its holder");
    // Without recent requests the mean is under 2: nobody is busy.
    assert_eq!(route(3.0, false).0, addr(0));
    assert!(RouterConfig::from_json(r#"{"busy_miss_weight": -1}"#).is_err());
    assert_eq!(RouterConfig::default().busy_miss_weight, 0.0);
}

/// `preamble_on_0`'s three endpoints (a 30-block preamble on 0) with `prefill_progress` on or off.
fn progress_router(prefill_progress: bool) -> (Router, Vec<u32>) {
    let cfg = RouterConfig {
        seed: Some(5),
        prefill_progress,
        ..Default::default()
    };
    preamble_on_0(cfg, 30)
}

/// Endpoint `i` times one prefill of 2,000 tokens (`prefill_progress`'s speed sample); returns at least
/// the time it measured, so its speed is at least 2,000 tokens per returned time.
fn time_a_prefill(r: &Router, i: usize) -> std::time::Duration {
    let timed = Instant::now();
    let mut first = r.begin(&addr(i), None, 2_000).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    first.first_token();
    timed.elapsed()
}

#[test]
fn a_holders_prefill_under_way_is_credited_at_its_measured_speed() {
    // Endpoint 0 holds a 30-block preamble (120 tokens); 1 and 2 hold other prompts. 0 has timed one
    // prefill (2,000 tokens in t1), then took a 3,000-token prompt and has been at it for 2 x t1: at the
    // measured speed it has done 4,000 tokens' worth, all of it. A question after the preamble waits
    // 3,000 + 3 x 8 on 0 as the backlog stands whole, 3 x 128 elsewhere: off, it leaves its holder; on,
    // 0's backlog reads as done and the hit stays.
    let route = |prefill_progress: bool| {
        let (r, preamble) = progress_router(prefill_progress);
        let t1 = time_a_prefill(&r, 0);
        let _backlog = r.begin(&addr(0), None, 3_000).unwrap();
        let begun = Instant::now(); // no earlier than its prefill began
        std::thread::sleep(2 * t1);
        assert!(begun.elapsed() >= 2 * t1);
        r.pick(&[preamble.clone(), prompt(21, 2)].concat(), None)
            .unwrap()
            .primary
            .to_string()
    };
    assert_ne!(route(false), addr(0), "off: the whole backlog sends the hit elsewhere");
    assert_eq!(route(true), addr(0), "on: the holder's prefill is done by now");
    assert!(
        RouterConfig::from_json(r#"{"prefill_progress": true}"#)
            .unwrap()
            .prefill_progress
    );
    assert!(!RouterConfig::default().prefill_progress);
}

#[test]
fn progress_is_credited_to_holders_only() {
    // Nobody holds a new prompt. Endpoint 1 has a timed speed and a 3,000-token prefill done by the
    // clock; 2 has 500 tokens pending and no speed (nothing credited); 0 3,000 and no speed. A whole miss
    // ranks the non-holders by their backlog as the load order keeps it, whole: 2 (500) takes it, where
    // crediting 1 would have sent it there (a shortlist could not credit 1 either).
    let (r, _) = progress_router(true);
    let t1 = time_a_prefill(&r, 1);
    let _backlog = r.begin(&addr(1), None, 3_000).unwrap();
    let _busy0 = r.begin(&addr(0), None, 3_000).unwrap();
    let _some2 = r.begin(&addr(2), None, 500).unwrap();
    std::thread::sleep(2 * t1);
    assert_eq!(r.pick(&prompt(30, 40), None).unwrap().primary.to_string(), addr(2));
}

#[test]
fn only_a_router_crediting_progress_keeps_prefill_clocks() {
    // Off, a request reads no clock: a timed prefill leaves no speed behind. On, the same prefill does.
    let rate_after_a_prefill = |prefill_progress: bool| {
        let (r, _) = progress_router(prefill_progress);
        time_a_prefill(&r, 0);
        let st = r.read_table().get(&addr(0)).unwrap().clone();
        st.prefill_clock.rate()
    };
    assert_eq!(rate_after_a_prefill(false), 0.0);
    assert!(rate_after_a_prefill(true) > 0.0);
}
