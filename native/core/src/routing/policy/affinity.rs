//! Cache affinity, shared by `prefix_cache` (approximate index) and `kv_events` (precise index): send
//! the request where its first token is expected soonest.
//!
//! 1. Spill gate (`filter.rs`) removes endpoints with too many requests waiting for a first token.
//! 2. The rest are ranked by expected wait, in prefill tokens: the endpoint's prefill backlog (our own
//!    requests not yet at their first token, or the engine's queued uncached tokens, whichever is
//!    larger) + `uncached_weight` (3) x this prompt's tokens past the endpoint's cached prefix +
//!    `request_cost` per request already on it (each running sequence slows every step a little).
//!    Ties: more cached blocks (keep the affinity), less load, then each endpoint's tie number (drawn
//!    anew at every change of its load, `load_order.rs`), then id.
//!
//! Why the uncached tokens count three times: a miss costs the request its own prefill; it costs the
//! engine that work again for everything queued behind it; and it fills KV that evicts other
//! prefixes, which later requests pay for as misses. The backlog is already committed and counts
//! once. Tuned on the workload suite (issue 13, docs/routing-benchmark.md): counted once (issue 6's
//! formula), a prefix group whose holder is busy was spread to an idle engine, prefilling the prefix
//! again there, and lost hit rate to SMG cache_aware on RAG and Zipf-skewed prefixes (up to 7.3
//! points); twice closed most of it; three times against twice on the same engines and arrivals (36
//! points: six shapes, three seeds, closed loop and 90% load) raised the hit rate by 0.7 points on
//! average (up to 11.8 on RAG under eviction pressure; 9 points higher, 3 lower) and cut mean TTFT
//! to 0.96x and p90 to 0.93x (geometric means); four times was no better than three on RAG and Zipf.
//! Where nothing is cached anywhere the term is equal for every endpoint and changes nothing.
//! 3. Holder band (`holder_slack_tokens`, off by default): the endpoints holding the request's longest
//!    cached prefix, when it covers at least half the prompt, have the slack taken off their expected
//!    wait, so they stay first unless their wait exceeds the best by more than the slack. Why it is a
//!    knob and not the default: a follow-up turn re-sends a history only its holder has, and moving it
//!    re-prefills that history elsewhere and strands the copy; but with the weight at 2 or more the holder
//!    already keeps ~99-100% of follow-ups in the suite's sessions shape (its `turns kept` column), so
//!    the band has little to win there, and on a hot shared prefix it adds queueing where the spill
//!    gate is the only brake (docs/routing-benchmark.md has the measurement).
//! 4. Resident sessions (`resident_session_tokens`, off by default; `residents.rs`): for a session's
//!    first request, each session that came back and whose last request went to an endpoint adds that
//!    many tokens to the endpoint's expected wait. Between turns a session has nothing in flight, so
//!    the present load misses the turns it will send there; without the term, new sessions sharing a
//!    preamble pile on its first holders at light load (the suite's agentic shape on 8 engines served
//!    from 4). Set above `uncached_weight` x the shared prefix, one resident session more moves a new
//!    session to an engine that must prefill the prefix again. Follow-ups are never priced: they
//!    follow their history.
//! 5. Fresh engines (`fresh_cache_weight`, 0.25): on an endpoint whose events show nothing cached and
//!    that has nothing on it (a new or restarted engine; one that publishes no events only until its
//!    first request of a block or more), the uncached tokens count at this weight instead. A miss
//!    there evicts nothing and delays nobody, and its copy of a shared prefix serves later requests:
//!    without it the first holders of a tool preamble keep every new session while engines started
//!    beside them stay empty (the suite's agentic shape on 8 engines: served max/mean 2.2 against
//!    SMG's 1.5-2.1). An engine is fresh until its events show a block (or, without events, until its
//!    first request of a full block: a readiness probe shorter than a block caches nothing and
//!    publishes nothing), so about one request per engine moves, follow-ups included. Why 0.25 and
//!    not 0: an idle holder still keeps a request whose uncached part there is under a quarter of the
//!    prompt (a short question after a cached system prompt), and 0.25 measured as well as 0 on the
//!    agentic shape (docs/routing-benchmark.md, "Fresh engines").
//! 6. Underused engines (`underused_share`, off by default): for a new request (no live session
//!    booking), an endpoint whose requests over the last `demand_window_s` (decayed) are below that
//!    share of the healthy endpoints' mean prices the uncached tokens at 0: only its backlog counts. The
//!    expected wait judges one request; a copy of a hot prefix pays off over the requests after it.
//!    At light load a holder's queue never outweighs a long prompt's prefill at any positive weight
//!    (session 13 measured 0.5 and 1 as no change), so a few hot system prompts started on fewer
//!    engines than the pool has (cold booking) stay there, and the other engines idle. An engine that
//!    lasts underused takes new requests (copying what they share) until its demand reaches the share;
//!    follow-ups keep their history (their session's booking marks them as not new).
//! 7. Busy endpoints (`busy_miss_weight`, off by default): on an endpoint that holds none of the prompt
//!    and was sent more requests over the last `demand_window_s` than the healthy endpoints' mean, the
//!    uncached tokens weigh that much more per share above the mean: `uncached_weight +
//!    busy_miss_weight x (recent / mean - 1)`. The holder of a hot prefix serves mostly hits, whose
//!    prefills are short, so its backlog is often the smallest and a burst of new prompts lands on it
//!    one by one; the hits that arrive during those prefills queue behind them. Only a whole miss is
//!    priced: on an endpoint holding part of the prompt the term moved partial hits off their holders
//!    (Zipf at seed 3), and an endpoint below the mean is not discounted (that drew hits off their
//!    holders too); docs/routing-benchmark.md, session 31.
//! 8. Fallbacks: the rest of that order, then the spilled endpoints by load.
//!
//! Prefill dominates time to first token, and an engine busy prefilling a long uncached prompt delays
//! every request behind it: a cache hit there can cost more than a miss on an idle engine.

use std::cmp::{Ordering, Reverse};

use super::filter::{GateLoadKey, SpillGate};
use super::{Candidate, PickContext, PrefixSource, WaitOrder};
use crate::routing::config::RouterConfig;
use crate::routing::load_order::base_wait;

pub struct Affinity {
    pub source: PrefixSource,
    pub gate: SpillGate,
    /// Prefill tokens one request already on an endpoint is worth.
    pub request_cost: u32,
    /// Weight of the request's own uncached prompt tokens (`uncached_weight`).
    pub uncached_weight: f64,
    /// The holder band (`holder_slack_tokens`): 0 is off.
    pub holder_slack: u32,
    /// Prefill tokens one other session resident on an endpoint is worth (`resident_session_tokens`):
    /// 0 is off.
    pub resident_cost: u32,
    /// Weight of the uncached tokens on a fresh endpoint (`fresh_cache_weight`); `None` is off.
    pub fresh_weight: Option<f64>,
    /// Extra weight of the uncached tokens per share of recent requests above the mean
    /// (`busy_miss_weight`): 0 is off.
    pub busy_weight: f64,
}

impl Affinity {
    /// The affinity policy reading `source`, with the spill gate and request cost from `cfg`.
    pub fn from_config(source: PrefixSource, cfg: &RouterConfig) -> Self {
        Affinity {
            source,
            gate: SpillGate::from_config(cfg),
            request_cost: cfg.request_cost_tokens,
            uncached_weight: cfg.uncached_weight,
            holder_slack: cfg.holder_slack_tokens,
            resident_cost: cfg.resident_session_tokens,
            fresh_weight: cfg.fresh_cache_weight,
            busy_weight: cfg.busy_miss_weight,
        }
    }

    /// The ranking of candidates holding nothing of the prompt: every such candidate's uncached tokens
    /// are the whole prompt, so its expected wait is `base_wait` plus the same term for all, and its
    /// key is (kept, that wait, 0 cached, load) then tie and id (`rank_top`); the holder band needs
    /// cached blocks. A busy candidate (`busy_miss_weight`) adds a term of its own, so it ranks at or
    /// below its place in this order (the router's shortlist lists those it passes).
    pub fn wait_order(&self) -> WaitOrder {
        WaitOrder {
            request_cost: self.request_cost,
            gate: self.gate,
        }
    }

    /// Expected prefill work ahead of the first token on `c`, in tokens.
    /// One term depends on the request: its uncached tokens, the whole prompt for every endpoint
    /// holding none of it; the rest is the endpoint's `base_wait`, the router's load order.
    pub fn expected_wait(&self, c: &Candidate) -> u64 {
        let weight = match self.fresh_weight {
            _ if c.underused => 0.0,
            Some(w) if c.fresh => w,
            _ if c.cached_blocks == 0 => self.uncached_weight + self.busy_weight * c.busy,
            _ => self.uncached_weight,
        };
        base_wait(&c.load, self.request_cost)
            + (f64::from(c.uncached_tokens()) * weight) as u64
            + u64::from(self.resident_cost) * u64::from(c.residents)
    }

    /// Whether `c` is in the holder band: it holds the longest cached prefix among `candidates`, and
    /// that prefix is at least half the prompt.
    fn holds_the_history(&self, c: &Candidate, longest: u32) -> bool {
        let cached = u64::from(c.cached_blocks) * u64::from(c.block_size);
        self.holder_slack > 0 && longest > 0 && c.cached_blocks == longest && 2 * cached >= u64::from(c.prompt_tokens)
    }

    pub fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        self.rank_top(ctx, ctx.candidates.len())
    }

    /// The first `k` of the ranking: each candidate's key computed once, then the best `k` kept while
    /// scanning (a few fallbacks: one comparison per candidate) or selected and sorted (large `k`), not
    /// every candidate sorted. Equal keys by the candidates' tie numbers, then ids: the order depends
    /// on the candidates alone, not on their places in the list, nor on which others are listed
    /// (beyond the spill gate's least loaded and the holder band's longest prefix), so the router may
    /// rank a shortlist.
    pub fn rank_top(&self, ctx: &PickContext<'_>, k: usize) -> Vec<usize> {
        let c = ctx.candidates;
        let n = c.len();
        let min = self.gate.min_requests(c);
        // The holder band's longest kept prefix (a pass only when the band is on).
        let longest = if self.holder_slack > 0 {
            (0..n)
                .filter(|&i| self.gate.keeps(&c[i], min))
                .map(|i| c[i].cached_blocks)
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        let key = |i: usize| {
            let spilled = !self.gate.keeps(&c[i], min);
            let (wait, cached) = if spilled {
                (0, 0)
            } else {
                let slack = if self.holds_the_history(&c[i], longest) {
                    u64::from(self.holder_slack)
                } else {
                    0
                };
                (self.expected_wait(&c[i]).saturating_sub(slack), c[i].cached_blocks)
            };
            (
                RankKey(spilled, wait, Reverse(cached), self.gate.load_key(&c[i].load)),
                i,
            )
        };
        let cmp = |a: &(RankKey, usize), b: &(RankKey, usize)| -> Ordering {
            a.0.cmp(&b.0)
                .then_with(|| (c[a.1].tie, c[a.1].id).cmp(&(c[b.1].tie, c[b.1].id)))
        };
        let k = k.min(n);
        if k == 0 {
            return Vec::new();
        }
        let mut top: Vec<(RankKey, usize)>;
        if k <= SCAN_AT_MOST {
            top = Vec::with_capacity(k + 1);
            for i in 0..n {
                let e = key(i);
                if top.len() == k && cmp(&e, &top[k - 1]) != Ordering::Less {
                    continue;
                }
                let at = top.partition_point(|x| cmp(x, &e) == Ordering::Less);
                top.insert(at, e);
                top.truncate(k);
            }
        } else {
            top = (0..n).map(key).collect();
            if k < n {
                top.select_nth_unstable_by(k - 1, cmp);
                top.truncate(k);
            }
            top.sort_unstable_by(cmp);
        }
        top.into_iter().map(|(_, i)| i).collect()
    }
}

/// Up to this many places the best are kept in a sorted buffer while scanning the candidates.
const SCAN_AT_MOST: usize = 16;

/// A candidate's place, before its random tie break: kept before spilled; kept ones by expected wait,
/// then more cached blocks, then load; spilled ones (wait and cached zero) by load.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RankKey(bool, u64, Reverse<u32>, GateLoadKey);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::config::SpillCounts;
    use crate::routing::policy::testing::cand;
    use crate::routing::rng::Rng;

    fn affinity(abs: u32, request_cost: u32) -> Affinity {
        weighted(abs, request_cost, 1.0)
    }

    fn weighted(abs: u32, request_cost: u32, uncached_weight: f64) -> Affinity {
        Affinity {
            source: PrefixSource::Events,
            gate: SpillGate {
                enabled: true,
                abs,
                ratio: 1.5,
                counts: SpillCounts::Requests,
            },
            request_cost,
            uncached_weight,
            holder_slack: 0,
            resident_cost: 0,
            fresh_weight: None,
            busy_weight: 0.0,
        }
    }

    fn rank(a: &Affinity, c: &[Candidate]) -> Vec<usize> {
        a.rank(&PickContext {
            candidates: c,
            session_key: None,
            rng: &Rng::new(0),
        })
    }

    #[test]
    fn follows_the_longest_prefix() {
        // 10 prompt blocks of 16 tokens; each cached block saves 16 tokens of prefill.
        let c = [cand(0, 2, 3), cand(1, 4, 8), cand(2, 0, 0), cand(3, 3, 5)];
        assert_eq!(rank(&affinity(8, 1), &c), vec![1, 3, 0, 2]);
    }

    #[test]
    fn spill_gate_diverts_from_an_overloaded_holder() {
        let c = [cand(0, 20, 10), cand(1, 4, 0), cand(2, 5, 2)];
        // 20 > 4 + 8 and 20 > 4 * 1.5: the holder is skipped and listed last.
        assert_eq!(rank(&affinity(8, 1), &c), vec![2, 1, 0]);
        assert_eq!(rank(&affinity(16, 1), &c)[0], 0, "within the slack the cache wins");
    }

    #[test]
    fn a_small_gain_goes_to_the_less_loaded() {
        // One cached block (16 tokens) is worth less than 5 more requests at 4 tokens each.
        let c = [cand(0, 6, 3), cand(1, 1, 2)];
        assert_eq!(rank(&affinity(8, 4), &c), vec![1, 0]);
        assert_eq!(rank(&affinity(8, 1), &c), vec![0, 1]);
        let cold = [cand(0, 3, 0), cand(1, 1, 0)];
        assert_eq!(rank(&affinity(8, 1), &cold)[0], 1, "nothing cached: least load");
    }

    #[test]
    fn a_prefill_backlog_outweighs_a_hit() {
        // Endpoint 0 holds the whole prompt but is prefilling 1,000 uncached tokens for others;
        // endpoint 1 holds nothing and is idle: 160 tokens of prefill there beat waiting.
        let mut busy = cand(0, 1, 10);
        busy.load.prefill_tokens = 1000;
        let idle = cand(1, 1, 0);
        assert_eq!(rank(&affinity(8, 1), &[busy, idle])[0], 1);
        // The engine's own report of queued uncached work counts the same way.
        let mut reported = cand(0, 1, 10);
        reported.load.engine.waiting_uncached_tokens = 1000;
        assert_eq!(rank(&affinity(8, 1), &[reported, idle])[0], 1);
        busy.load.prefill_tokens = 100;
        assert_eq!(
            rank(&affinity(8, 1), &[busy, idle])[0],
            0,
            "a small backlog: the hit wins"
        );
    }

    #[test]
    fn the_uncached_weight_prices_the_work_a_miss_adds() {
        // A holds 6 of 10 blocks (64 tokens left) with 7 requests (112 tokens at 16 each); B is idle
        // and cold (160 tokens). Counted once, the miss on B waits less; counted twice (the prefill
        // B would add delays whatever comes next there), the shared prefix on A wins.
        let c = [cand(0, 7, 6), cand(1, 0, 0)];
        assert_eq!(rank(&weighted(8, 16, 1.0), &c)[0], 1);
        assert_eq!(rank(&weighted(8, 16, 2.0), &c)[0], 0);
        // The default, 3: A prefilling 224 tokens for one request (240 with its request cost) waits
        // 240 + 3 x 64 = 432 against B's 3 x 160 = 480 and keeps the prefix, where twice would spread
        // it (240 + 128 = 368 > 320).
        let mut busy = cand(0, 1, 6);
        busy.load.prefill_tokens = 224;
        let c = [busy, cand(1, 0, 0)];
        assert_eq!(rank(&weighted(8, 16, 2.0), &c)[0], 1);
        assert_eq!(rank(&weighted(8, 16, 3.0), &c)[0], 0);
        let default = Affinity::from_config(PrefixSource::Events, &RouterConfig::default());
        assert_eq!(default.uncached_weight, 3.0);
        assert_eq!(rank(&default, &c)[0], 0);
        // With nothing cached anywhere the weight changes nothing: least load still wins.
        let cold = [cand(0, 3, 0), cand(1, 1, 0)];
        assert_eq!(rank(&weighted(8, 16, 3.0), &cold)[0], 1);
    }

    #[test]
    fn a_fresh_endpoint_prices_a_miss_at_the_fresh_weight() {
        // A holds 6 of 10 blocks with one request on it (16 + 3 x 64 = 208); B is idle and cold
        // (3 x 160 = 480). Marked fresh (a new engine with nothing cached), B's miss counts at the
        // fresh weight: 0 takes it there, 1 (160 against 208) too, 2 (320) leaves the prefix on A.
        let mut fresh = cand(1, 0, 0);
        fresh.fresh = true;
        let c = [cand(0, 1, 6), fresh];
        let with = |w: Option<f64>| Affinity {
            fresh_weight: w,
            busy_weight: 0.0,
            ..weighted(8, 16, 3.0)
        };
        assert_eq!(rank(&with(None), &c)[0], 0, "off: the default weight");
        assert_eq!(rank(&with(Some(0.0)), &c)[0], 1);
        assert_eq!(rank(&with(Some(1.0)), &c)[0], 1);
        assert_eq!(rank(&with(Some(2.0)), &c)[0], 0);
        // Only the fresh candidate is priced so: the same idle cold B, not fresh, still loses.
        let c = [cand(0, 1, 6), cand(1, 0, 0)];
        assert_eq!(rank(&with(Some(0.0)), &c)[0], 0);
    }

    #[test]
    fn the_holder_band_keeps_a_busy_history_holder_within_its_slack() {
        // A holds 6 of 10 blocks (96 of 160 tokens: more than half) but is prefilling 300 tokens for
        // others: wait 300 + 2 x 64 = 428; B is idle and cold: 2 x 160 = 320. Without the band B wins.
        let mut holder = cand(0, 1, 6);
        holder.load.prefill_tokens = 300;
        let cold = cand(1, 0, 0);
        let mut banded = weighted(8, 0, 2.0);
        assert_eq!(rank(&banded, &[holder, cold])[0], 1);
        // With 128 tokens of slack the holder stays first (428 - 128 <= 320) ...
        banded.holder_slack = 128;
        assert_eq!(rank(&banded, &[holder, cold])[0], 0);
        // ... but not once its wait exceeds the best by more than the slack.
        holder.load.prefill_tokens = 400;
        assert_eq!(rank(&banded, &[holder, cold])[0], 1);
        // A short match (3 of 10 blocks: less than half the prompt) is not a history: no band.
        let mut short = cand(0, 1, 3);
        short.load.prefill_tokens = 60; // 60 + 2 x 112 = 284 vs 320 for B: A first on its wait alone
        assert_eq!(rank(&banded, &[short, cold])[0], 0);
        short.load.prefill_tokens = 120; // 344 > 320: B, whatever the slack
        assert_eq!(rank(&banded, &[short, cold])[0], 1);
        // Only the longest holder is banded: a shorter one gets no slack against it.
        let mut longer = cand(2, 0, 8);
        longer.load.prefill_tokens = 100; // 100 + 2 x 32 = 164
        let mut shorter = cand(3, 0, 6);
        shorter.load.prefill_tokens = 0; // 128, banded it would be 0
        assert_eq!(rank(&banded, &[longer, shorter])[0], 0, "164 - 128 = 36 < 128");
        banded.holder_slack = 0;
        assert_eq!(rank(&banded, &[longer, shorter])[0], 1);
    }
}

/// The selection against the full sort it replaced (decisions must not change).
#[cfg(test)]
mod selection_tests {
    use proptest::prelude::*;

    use super::*;
    use crate::routing::config::SpillCounts;
    use crate::routing::load::{EngineLoad, Load};
    use crate::routing::rng::Rng;

    /// The ranking as it was: every candidate sorted, its key recomputed per comparison.
    fn full_sort(a: &Affinity, ctx: &PickContext<'_>) -> Vec<usize> {
        let c = ctx.candidates;
        let (mut order, mut spilled) = a.gate.split(c);
        order.sort_unstable_by_key(|&i| {
            (
                a.expected_wait(&c[i]),
                std::cmp::Reverse(c[i].cached_blocks),
                a.gate.load_key(&c[i].load),
                c[i].tie,
                c[i].id,
            )
        });
        spilled.sort_unstable_by_key(|&i| (a.gate.load_key(&c[i].load), c[i].tie, c[i].id));
        order.extend(spilled);
        order
    }

    fn candidate() -> impl Strategy<Value = Candidate> {
        // Small ranges so that waits, cached prefixes and loads tie often.
        (
            0..6u32,
            0..4u32,
            0..3u64,
            0..5u32,
            prop_oneof![Just(0u32), Just(16)],
            0..2u32,
            0..3u64,
            0..3u32,
        )
            .prop_map(
                |(requests, tokens_k, prefill, cached, block_size, waiting, tie, prefilling)| Candidate {
                    id: 0,
                    address_hash: 0,
                    load: Load {
                        in_flight_requests: requests,
                        in_flight_tokens: u64::from(tokens_k) * 100,
                        prefill_tokens: prefill * 50,
                        prefilling_requests: prefilling.min(requests),
                        engine: EngineLoad {
                            waiting: waiting * 3,
                            ..Default::default()
                        },
                    },
                    cached_blocks: cached,
                    prompt_blocks: 4,
                    prompt_tokens: 64,
                    block_size,
                    tie,
                    residents: 0,
                    fresh: false,
                    underused: false,
                    busy: 0.0,
                },
            )
    }

    proptest! {
        #[test]
        fn selecting_the_top_k_matches_the_full_sort(
            mut candidates in proptest::collection::vec(candidate(), 1..80),
            k in 0..90usize,
            seed in any::<u64>(),
            gate in any::<bool>(),
            abs in 0..4u32,
            request_cost in 0..40u32,
            weight in prop_oneof![Just(1.0), Just(2.0), Just(0.5)],
            counts in prop_oneof![Just(SpillCounts::Requests), Just(SpillCounts::Prefilling)],
        ) {
            for (i, c) in candidates.iter_mut().enumerate() {
                c.id = i * 97;
            }
            let a = Affinity {
                source: PrefixSource::Events,
                gate: SpillGate { enabled: gate, abs, ratio: 1.5, counts },
                request_cost,
                uncached_weight: weight,
                holder_slack: 0,
                resident_cost: 0,
                fresh_weight: None,
                busy_weight: 0.0,
            };
            let rng = Rng::new(seed);
            let ctx = PickContext { candidates: &candidates, session_key: None, rng: &rng };
            let mut want = full_sort(&a, &ctx);
            want.truncate(k);
            prop_assert_eq!(a.rank_top(&ctx, k), want);
        }
    }
}
