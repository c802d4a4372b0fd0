//! The shortlist (`Router::shortlist`) against ranking every endpoint (`Router::rank_all`): the same
//! decisions on random states, and the load order kept current by picks, health, penalties and removal.

use std::time::Instant;

use super::*;
use crate::routing::config::SpillCounts;
use crate::routing::penalty::Failure;

const B: u32 = 4;
/// Blocks of each shared prefix.
const PREFIX: usize = 6;

fn addr(i: usize) -> String {
    format!("10.1.{}.{}:50051", i / 200, i % 200)
}

/// A small deterministic generator, so that every case can be replayed from its seed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

/// Shared prefix `p`'s tokens, then `tail` unique blocks.
fn tokens(p: u32, tail: u32, unique: u32) -> Vec<u32> {
    let mut t: Vec<u32> = (0..PREFIX as u32 * B).map(|k| p * 1000 + k).collect();
    t.extend((0..tail * B).map(|k| 1_000_000 + unique * 1000 + k));
    t
}

/// What a decision decides: its first `k` endpoints with their cached blocks, the primary's fallbacks,
/// and the most blocks any candidate held.
type Outcome = (Vec<(Arc<str>, u32)>, Vec<Arc<str>>, u32);

fn outcome(r: &Router, d: &Decision<'_>, k: usize) -> Outcome {
    let top = d.ranking[..k.min(d.ranking.len())]
        .iter()
        .map(|&i| (d.states[i].address.clone(), d.candidates[i].cached_blocks))
        .collect();
    let best = d.candidates.iter().map(|c| c.cached_blocks).max().unwrap_or(0);
    (top, r.fallbacks(&d.states, &d.ranking), best)
}

/// A router over a random pool: block sizes (mostly one, sometimes a second or unknown), prefixes held
/// to random depths in the policy's index, loads from our requests and engine reports, some endpoints
/// unhealthy or ejected. Loads come from small sets, so that many keys tie.
fn random_router(g: &mut Lcg, seed: u64) -> (Router, Vec<InFlight>) {
    let policy = g.pick(&["kv_events", "kv_events", "prefix_cache"]);
    let cfg = RouterConfig {
        seed: Some(seed),
        max_fallbacks: g.below(5) as usize,
        spill_enabled: g.chance(80),
        spill_abs: g.below(4) as u32,
        spill_ratio: g.pick(&[1.0, 1.5, 2.0]),
        spill_counts: g.pick(&[SpillCounts::Requests, SpillCounts::Prefilling]),
        request_cost_tokens: g.pick(&[0, 1, 16, 40]),
        uncached_weight: g.pick(&[1.0, 2.0, 3.0]),
        holder_slack_tokens: g.pick(&[0, 0, 8, 64]),
        book_routed_s: g.pick(&[0.0, 0.0, 5.0]),
        book_cold_s: g.pick(&[0.0, 0.0, 2.0]),
        book_cold_spread: g.pick(&[1, 1, 2]),
        book_cold_spread_share: g.pick(&[0.0, 0.0, 0.02, 0.5]),
        fresh_cache_weight: g.pick(&[None, Some(0.0), Some(0.25), Some(1.0)]),
        underused_share: g.pick(&[0.0, 0.0, 0.5, 1.0]),
        busy_miss_weight: g.pick(&[0.0, 0.0, 1.0, 3.0]),
        ..Default::default()
    };
    let mut r = Router::new(policy, cfg).unwrap();
    r.shortlist_from = 0;
    let n = 20 + g.below(60) as usize;
    let mixed = g.chance(25);
    let sizes: Vec<u32> = (0..n)
        .map(|_| if mixed { g.pick(&[B, B, 2 * B, 0]) } else { B })
        .collect();
    r.set_endpoints((0..n).map(|i| (addr(i), sizes[i])).collect()).unwrap();
    let root = block_hash::root(None, None);
    for (i, &bs) in sizes.iter().enumerate() {
        // Some publish events (an empty batch: nothing cached yet), so that a pick leaves them fresh;
        // many of the others were routed to before: idle but not fresh.
        if g.chance(30) {
            let published = r.apply_kv_events(&addr(i), &KvEventBatch::default().encode_to_vec());
            assert_eq!(published.outcome.kind(), "applied");
        } else if g.chance(60) {
            r.read_table().get(&addr(i)).unwrap().mark_routed();
        }
        if bs == 0 || !g.chance(40) {
            continue;
        }
        let p = g.below(3) as u32;
        let depth = 1 + g.below(PREFIX as u64 * u64::from(B) / u64::from(bs)) as usize;
        let hashes = block_hash::prompt_hashes(&tokens(p, 0, 0), bs as usize, root);
        let id = r.read_table().get(&addr(i)).unwrap().id;
        if policy == "kv_events" {
            r.events.insert(id, &hashes[..depth.min(hashes.len())], 0);
        }
        if policy == "prefix_cache" || g.chance(30) {
            r.routed.insert(id, &hashes[..depth.min(hashes.len())], Tick::MAX);
        }
    }
    // Now and then nearly every endpoint fails: the shortlist's walks pass over the ejected ones.
    let ejecting = if g.chance(10) { 95 } else { 10 };
    let mut guards = Vec::new();
    for i in 0..n {
        // Requests sent lately and ended (`underused_share`'s counts): a mean of about 4.
        for _ in 0..g.below(6) {
            drop(r.begin(&addr(i), None, 0).unwrap());
        }
        for _ in 0..g.below(4) {
            let mut guard = r.begin(&addr(i), None, g.pick(&[0, 64, 128])).unwrap();
            if g.chance(50) {
                guard.first_token();
            }
            guards.push(guard);
        }
        if g.chance(30) {
            let load = EngineLoad {
                running: g.below(3) as u32,
                waiting: g.below(2) as u32,
                waiting_uncached_tokens: g.pick(&[0, 0, 100]),
                ..Default::default()
            };
            r.set_engine_load(&addr(i), None, &load);
        }
        if g.chance(10) {
            r.set_health(&addr(i), false);
        }
        if g.chance(ejecting) {
            r.report(&addr(i), None, Err(g.pick(&[Failure::Down, Failure::Busy])));
        }
    }
    (r, guards)
}

#[test]
fn a_shortlist_decides_as_ranking_every_endpoint() {
    let (mut compared, mut declined) = (0, 0);
    let (mut shortlisted, mut candidates) = (0, 0);
    for seed in 0..400u64 {
        let mut g = Lcg(seed);
        let (r, mut guards) = random_router(&mut g, seed);
        let k = 1 + r.config.max_fallbacks;
        // A few picks in a row, each changing the loads the next one sees.
        for step in 0..4 {
            let t = tokens(g.below(4) as u32, g.below(3) as u32, step);
            // Sessions: a later step of a session whose earlier prompt was the prefix alone (no tail)
            // extends it and finds its booking (`book_session_s`).
            let req = PickRequest {
                token_ids: &t,
                session_key: g.pick(&[None, Some("a"), Some("b")]),
                ..Default::default()
            };
            let (clock, now) = (Instant::now(), r.now());
            let table = r.read_table();
            let short = r.shortlist(&table, &req, clock, now);
            let all = r.rank_all(&table, &req, clock, now);
            match (short, all) {
                (Some(short), Ok(all)) => {
                    assert_eq!(
                        outcome(&r, &short, k),
                        outcome(&r, &all, k),
                        "seed {seed} step {step}: {} shortlisted of {}",
                        short.candidates.len(),
                        all.candidates.len()
                    );
                    compared += 1;
                    shortlisted += short.candidates.len();
                    candidates += all.candidates.len();
                }
                (None, _) => declined += 1,
                (Some(_), Err(e)) => panic!("seed {seed}: a shortlist where ranking every endpoint says {e:?}"),
            }
            drop(table);
            if let Ok(pick) = r.route(&req) {
                guards.push(pick.in_flight);
            }
        }
    }
    // Declined: every endpoint ejected (the penalty then lets them all in), or too many in the way.
    assert!(compared > 10 * declined, "{compared} compared, {declined} declined");
    // Not a vacuous comparison: the shortlists left most candidates out.
    assert!(
        2 * shortlisted < candidates,
        "{shortlisted} shortlisted of {candidates}"
    );
}

#[test]
fn a_large_pool_shortlists_its_underused_endpoints_few_or_many() {
    // 1,000 endpoints, each with one request in flight; lately the busy ones were sent more, and 10 or
    // 600 were not (more than `SHORTLIST_SKIPS`: the walk of the underused ones is not the budget's
    // business, they are the walk). Either way the mean is
    // about 5 requests, the idle ones (1) are under half of it, and a new request on a prefix that 900
    // holds goes to an idle one without backlog: 16 for its request, its uncached tokens at 0, against
    // 16 + 3 x 8 on the holder.
    for (idle, busy_sent) in [(10usize, 4usize), (600, 10)] {
        let r = pool(
            1_000,
            RouterConfig {
                seed: Some(8),
                max_fallbacks: 2,
                underused_share: 0.5,
                ..Default::default()
            },
        );
        served(&r);
        for i in idle..1_000 {
            for _ in 0..busy_sent {
                drop(r.begin(&addr(i), None, 0).unwrap());
            }
        }
        // Every third idle endpoint has no backlog; the others 64 or 128 prompt tokens to prefill.
        let held: Vec<InFlight> = (0..1_000)
            .map(|i| {
                let backlog = if i < idle { (i as u64 % 3) * 64 } else { 0 };
                r.begin(&addr(i), None, backlog).unwrap()
            })
            .collect();
        let root = block_hash::root(None, None);
        let t = tokens(1, 2, 0);
        let id = r.read_table().get(&addr(900)).unwrap().id;
        r.events
            .insert(id, &block_hash::prompt_hashes(&t, B as usize, root)[..PREFIX], 0);
        let req = PickRequest {
            token_ids: &t,
            ..Default::default()
        };
        let table = r.read_table();
        let (clock, now) = (Instant::now(), r.now());
        let short = r.shortlist(&table, &req, clock, now).expect("a shortlist");
        let all = r.rank_all(&table, &req, clock, now).unwrap();
        assert_eq!(outcome(&r, &short, 3), outcome(&r, &all, 3), "{idle} idle");
        assert!(
            short.candidates.len() <= 1 + 1 + 3 + 3,
            "{idle} idle: {}",
            short.candidates.len()
        );
        let primary = short.states[short.ranking[0]].address.to_string();
        let i = (0..idle).find(|&i| addr(i) == primary);
        assert!(i.is_some_and(|i| i % 3 == 0), "{idle} idle: {primary}");
        drop((table, held));
    }
}

/// Marks every endpoint as routed to before (a pool that has served): none publishes events, so none
/// is fresh (`fresh_cache_weight`).
fn served(r: &Router) {
    for st in r.read_table().slots.iter().flatten() {
        st.mark_routed();
    }
}

/// A pool of `n` idle endpoints that ranks shortlists.
fn pool(n: usize, cfg: RouterConfig) -> Router {
    let r = Router::new("kv_events", cfg).unwrap();
    r.set_endpoints((0..n).map(|i| (addr(i), B)).collect()).unwrap();
    assert!(n >= r.shortlist_from);
    r
}

fn shortlisted(r: &Router, t: &[u32]) -> Vec<Arc<str>> {
    let req = PickRequest {
        token_ids: t,
        ..Default::default()
    };
    let table = r.read_table();
    let d = r.shortlist(&table, &req, Instant::now(), r.now()).expect("a shortlist");
    d.candidates
        .iter()
        .map(|c| table.slots[c.id].as_ref().unwrap().address.clone())
        .collect()
}

#[test]
fn a_large_pool_looks_at_its_holders_and_a_few_least_loaded() {
    let cfg = RouterConfig {
        seed: Some(5),
        max_fallbacks: 2,
        ..Default::default()
    };
    let r = pool(1_000, cfg);
    served(&r);
    // One request on every endpoint, already prefilled (no backlog).
    let mut held: Vec<InFlight> = (0..1_000).map(|i| r.begin(&addr(i), None, 0).unwrap()).collect();
    // Endpoints 10 and 20 are idle; 500 holds the prompt's prefix.
    held.retain(|g| g.address() != addr(10) && g.address() != addr(20));
    let root = block_hash::root(None, None);
    let t = tokens(1, 2, 0);
    let id = r.read_table().get(&addr(500)).unwrap().id;
    r.events
        .insert(id, &block_hash::prompt_hashes(&t, B as usize, root)[..PREFIX], 0);
    let list = shortlisted(&r, &t);
    assert!(list.len() <= 1 + 3, "holder + 3 by wait: {list:?}");
    for a in [addr(10), addr(20), addr(500)] {
        assert!(list.iter().any(|x| **x == *a), "{a} in {list:?}");
    }
    let pick = r.pick(&t, None).unwrap();
    assert_eq!(
        pick.address(),
        addr(500),
        "the holder: 16 for its request + 2 x 8 uncached tokens, below 2 x 32 on an idle one"
    );
}

#[test]
fn an_engine_added_to_a_large_pool_is_shortlisted_while_fresh() {
    let r = pool(
        1_000,
        RouterConfig {
            seed: Some(6),
            max_fallbacks: 2,
            ..Default::default()
        },
    );
    served(&r);
    let held: Vec<InFlight> = (0..1_000).map(|i| r.begin(&addr(i), None, 0).unwrap()).collect();
    let root = block_hash::root(None, None);
    let t = tokens(1, 2, 0);
    let id = r.read_table().get(&addr(500)).unwrap().id;
    r.events
        .insert(id, &block_hash::prompt_hashes(&t, B as usize, root)[..PREFIX], 0);
    // Scale-out: a new engine joins (ids are handed out in order: it is the last in every tie).
    r.set_endpoints((0..=1_000).map(|i| (addr(i), B)).collect()).unwrap();
    assert!(shortlisted(&r, &t).iter().any(|a| **a == *addr(1_000)));
    // Its miss counts at 0.25 (8 against the holder's 16 + 3 x 8): it takes the prompt, once.
    let first = r.pick(&t, None).unwrap();
    assert_eq!(first.address(), addr(1_000));
    let second = r.pick(&t, None).unwrap();
    assert_eq!(second.address(), addr(500), "routed once, it is fresh no more");
    drop((held, first, second));
}

#[test]
fn picks_follow_the_load_order_as_requests_start_and_end() {
    let r = pool(
        300,
        RouterConfig {
            seed: Some(1),
            ..Default::default()
        },
    );
    let t = tokens(0, 1, 0);
    // Every pick starts a request on its endpoint: 300 picks cover the pool once before any repeats.
    let picks: Vec<Pick> = (0..300).map(|_| r.pick(&t, None).unwrap()).collect();
    let mut seen: Vec<&str> = picks.iter().map(|p| p.address()).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 300);
    // Requests ending on 7 and 9 make them the least loaded.
    let (mut ended, kept): (Vec<Pick>, Vec<Pick>) = picks
        .into_iter()
        .partition(|p| p.address() == addr(7) || p.address() == addr(9));
    ended.clear();
    let next: Vec<Pick> = (0..2).map(|_| r.pick(&t, None).unwrap()).collect();
    let mut got: Vec<&str> = next.iter().map(|p| p.address()).collect();
    got.sort_unstable();
    assert_eq!(got, [addr(7), addr(9)]);
    drop(kept);
}

#[test]
fn a_shortlist_leaves_out_unhealthy_ejected_and_removed_endpoints() {
    let r = pool(
        200,
        RouterConfig {
            seed: Some(2),
            ..Default::default()
        },
    );
    let t = tokens(0, 1, 0);
    let _busy: Vec<InFlight> = (3..200).map(|i| r.begin(&addr(i), None, 10).unwrap()).collect();
    // 0, 1 and 2 are idle: one unhealthy, one ejected, one removed.
    r.set_health(&addr(0), false);
    r.report(&addr(1), None, Err(Failure::Down));
    let remaining: Vec<(String, u32)> = (0..200).filter(|&i| i != 2).map(|i| (addr(i), B)).collect();
    r.set_endpoints(remaining).unwrap();
    for _ in 0..20 {
        let pick = r.pick(&t, None).unwrap();
        assert!(
            ![addr(0), addr(1), addr(2)].contains(&pick.address().to_string()),
            "{}",
            pick.address()
        );
    }
    // Healthy again: the least loaded.
    r.set_health(&addr(0), true);
    assert_eq!(r.pick(&t, None).unwrap().address(), addr(0));
}

#[test]
fn a_subset_ranks_and_shedding_rank_every_endpoint() {
    let cfg = RouterConfig {
        seed: Some(3),
        shed_queue_depth: 1,
        objectives: [("batch".to_string(), -1)].into(),
        ..Default::default()
    };
    let r = pool(200, cfg);
    let t = tokens(0, 1, 0);
    let table = r.read_table();
    let (clock, now) = (Instant::now(), r.now());
    let plain = PickRequest {
        token_ids: &t,
        ..Default::default()
    };
    assert!(r.shortlist(&table, &plain, clock, now).is_some());
    let subset = [addr(5).leak() as &str];
    let hinted = PickRequest {
        subset: Some(&subset),
        ..plain
    };
    assert!(r.shortlist(&table, &hinted, clock, now).is_none());
    let sheddable = PickRequest {
        objective: Some("batch"),
        ..plain
    };
    assert!(r.shortlist(&table, &sheddable, clock, now).is_none());
    drop(table);
    let ranks = Router::new("kv_events", RouterConfig::default()).unwrap();
    ranks
        .set_endpoints((0..200).map(|i| (format!("{}#{}", addr(i / 2), i % 2), B)).collect())
        .unwrap();
    let table = ranks.read_table();
    assert!(ranks.shortlist(&table, &plain, clock, now).is_none());
}
