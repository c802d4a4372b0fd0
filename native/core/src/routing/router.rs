//! The router of one served model: its endpoints (health, block size, loads), the two prefix indexes,
//! and its policy. Thread-safe: picks, load updates and event application run concurrently from any
//! thread; a pick takes only read locks (the endpoint table, then one index shard per prompt block).

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Instant;

use prost::Message;

use super::block_hash::{self, BlockHash};
use super::config::RouterConfig;
use super::demand::{self, busy_share, RecentRequests};
use super::endpoint::{rank_name, split_name, EndpointState, InFlight};
use super::endpoint_set::{EndpointId, EndpointSet, MAX_ENDPOINTS};
use super::error::RoutingError;
use super::events::{BatchResult, EventOutcome, EventState, OnGap};
use super::load::{EngineLoad, Load};
use super::load_order::{Entry, LoadOrder};
use super::membership::Tick;
use super::penalty::{Failure, Standing};
use super::policy::{registry, Candidate, PickContext, Policy, PrefixSource, WaitOrder};
use super::prefill_progress;
use super::prefix_index::{EventIndex, RoutedIndex};
use super::residents::Residents;
use super::rng::Rng;
use super::session_bookings::SessionBookings;
use super::zmq_events;
use crate::metrics;
use crate::pb::kv_events::KvEventBatch;

/// What to route.
#[derive(Clone, Copy, Debug, Default)]
pub struct PickRequest<'a> {
    pub token_ids: &'a [u32],
    /// Consistent hashing key: the `x-session-id` header or the request's `user` field.
    pub session_key: Option<&'a str>,
    /// Envoy's subset hint: only these addresses may be picked (`None`: any). An engine address admits
    /// every data-parallel rank of the engine.
    pub subset: Option<&'a [&'a str]>,
    /// Cache namespace of the request (LoRA adapter, cache salt), as the engine hashes its blocks.
    pub lora_name: Option<&'a str>,
    pub cache_salt: Option<&'a str>,
    /// The `x-gateway-inference-objective` header: the request's priority (`RouterConfig::priority`),
    /// which decides whether it may be shed.
    pub objective: Option<&'a str>,
}

/// The routing decision. The request counts as in flight on `primary` while `in_flight` lives.
#[derive(Debug)]
pub struct Pick {
    /// The endpoint's name: an engine address, or `"{address}#{rank}"` for one data-parallel rank
    /// (`address()` and `rank()` split it).
    pub primary: Arc<str>,
    /// Next best engines' addresses, in order (at most `max_fallbacks`): each engine once, never the
    /// primary's (another rank of the same engine is no remedy for a failed connection). When the
    /// primary is a rank, only engines that have that rank (the request is pinned to it).
    pub fallbacks: Vec<Arc<str>>,
    /// Leading prompt blocks the primary holds per the policy's index (0 when it reads none).
    pub cached_blocks: u32,
    /// The primary's block size (0 when unknown).
    pub block_size: u32,
    /// The most leading prompt blocks any candidate held (more than `cached_blocks`: load sent the
    /// request past a better cache, a spill).
    pub best_cached_blocks: u32,
    pub in_flight: InFlight,
}

impl Pick {
    /// The primary's engine address (where the request goes).
    pub fn address(&self) -> &str {
        split_name(&self.primary).0
    }

    /// The primary's data-parallel rank (the request's `data_parallel_rank`); `None` for an engine of
    /// one rank.
    pub fn rank(&self) -> Option<u32> {
        split_name(&self.primary).1
    }

    /// Prompt tokens the primary is expected to serve from its prefix cache.
    pub fn cached_tokens(&self) -> u32 {
        self.cached_blocks * self.block_size
    }
}

/// Why a request got no endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRoute {
    /// No healthy endpoint (inside the subset, when one was given).
    NoEndpoint,
    /// Shedding: the request is sheddable (negative priority) and every candidate's queue is at
    /// `shed_queue_depth` or deeper.
    Overloaded,
}

/// One endpoint as the router sees it (for metrics and debugging).
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointInfo {
    /// The endpoint's name (an address, or `"{address}#{rank}"`).
    pub address: Arc<str>,
    pub healthy: bool,
    pub block_size: u32,
    pub load: Load,
    /// Its KV-event stream has delivered at least one batch.
    pub publishes_events: bool,
    /// Engine block hashes mapped for the endpoint.
    pub engine_blocks: usize,
    /// Nothing is cached on it as far as the router knows (`EndpointState::nothing_cached`): while it is
    /// also idle, its requests' uncached tokens are priced at `fresh_cache_weight`.
    pub nothing_cached: bool,
    /// Where its failure record stands (`penalty.rs`).
    pub standing: Standing,
    /// Its consecutive failures (`penalty.rs`; 0: none).
    pub failures: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexStats {
    pub event_blocks: usize,
    pub routed_blocks: usize,
    /// Bytes of the precise index's tables (block table, slots, spilled holder sets).
    pub index_bytes: usize,
    /// Bytes of both indexes and every endpoint's engine-hash map.
    pub memory_bytes: usize,
}

#[derive(Default)]
struct Table {
    slots: Vec<Option<Arc<EndpointState>>>,
    by_address: HashMap<Arc<str>, EndpointId>,
    /// Ids of removed endpoints whose blocks are still being cleared: not reusable yet.
    retired: EndpointSet,
    /// Endpoints that are one data-parallel rank of an engine.
    ranks: usize,
}

impl Table {
    /// The endpoint of that name.
    fn get(&self, name: &str) -> Option<&Arc<EndpointState>> {
        self.by_address.get(name).and_then(|&id| self.slots[id].as_ref())
    }

    /// The endpoint serving rank `rank` of the engine at `address`: the engine itself when it is routed
    /// as a whole (one rank; whatever `rank` says), else its endpoint of that rank, rank 0 when `None`.
    fn resolve(&self, address: &str, rank: Option<u32>) -> Option<&Arc<EndpointState>> {
        self.get(address)
            .or_else(|| self.get(&rank_name(address, rank.unwrap_or(0))))
    }

    /// The endpoints of the engine at `address`: all its ranks (or the one endpoint of that name).
    fn engine<'a>(&'a self, address: &'a str) -> impl Iterator<Item = &'a Arc<EndpointState>> + 'a {
        self.slots
            .iter()
            .flatten()
            .filter(move |st| *st.engine == *address || *st.address == *address)
    }
}

pub struct Router {
    policy_name: String,
    policy: Box<dyn Policy>,
    source: PrefixSource,
    config: RouterConfig,
    table: RwLock<Table>,
    events: EventIndex,
    routed: RoutedIndex,
    rng: Rng,
    epoch: Instant,
    ttl: Tick,
    /// Optimistic booking's lease (`book_routed_s`), in ticks; 0: off.
    book: Tick,
    /// Cold booking's lease (`book_cold_s`), in ticks; 0: off.
    book_cold: Tick,
    /// Each session's last routed prompt, for its own next requests (`book_session_s`).
    session_bookings: Option<SessionBookings>,
    /// The policy's order of the endpoints holding none of the prompt, and the endpoints kept in it
    /// (`None`: the policy ranks otherwise).
    wait_order: Option<(WaitOrder, Arc<LoadOrder>)>,
    /// Healthy endpoints from which a pick ranks a shortlist (`SHORTLIST_FROM`).
    shortlist_from: usize,
    /// Sessions resident per endpoint, tracked when the policy prices them (`resident_session_tokens`).
    residents: Option<Residents>,
    /// The window of each endpoint's recent requests, in ticks, when underused or busy endpoints are
    /// priced (`underused_share`, `busy_miss_weight`); 0: off, and nothing is counted.
    demand_window: Tick,
    /// The requests sent to the healthy endpoints lately, decayed as each endpoint's count: their sum,
    /// kept as they change (an endpoint leaving or rejoining the pool takes its count along), for the
    /// mean in O(1). A race between a pick and a health change may leave it slightly off; the error
    /// fades with the window.
    pool_recent: RecentRequests,
}

/// The healthy endpoints' mean recent requests below which no endpoint counts as underused or busy: a
/// trickle of traffic is no imbalance worth a copy or a move.
const DEMAND_MIN_MEAN: f64 = 2.0;

/// From this many healthy endpoints on, a policy with a `wait_order` ranks a shortlist (`Router::
/// shortlist`); below it, every endpoint (a scan of a few dozen costs less than the walks).
const SHORTLIST_FROM: usize = 128;

/// Ejected or spilled endpoints a shortlist's walks may pass over before the pick ranks every endpoint
/// instead: a shortlist stays a few dozen endpoints (plus the prompt's holders) whatever the pool.
const SHORTLIST_SKIPS: usize = 256;

/// A ranking and what it ranked: every candidate endpoint, or a shortlist of them.
struct Decision<'t> {
    states: Vec<&'t Arc<EndpointState>>,
    candidates: Vec<Candidate>,
    /// Indices into both, best first: the primary and (at least) its fallbacks.
    ranking: Vec<usize>,
    chains: Chains,
}

/// The prompt's block hashes per block size: `(block size, chain)`.
type Chains = Vec<(u32, Vec<BlockHash>)>;

impl Router {
    pub fn new(policy_name: &str, config: RouterConfig) -> Result<Router, RoutingError> {
        let policy = registry::policy(policy_name, &config)?;
        let seed = config.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let demand_window = if config.underused_share > 0.0 || config.busy_miss_weight > 0.0 {
            ((config.demand_window_s * 10.0).ceil() as Tick).max(1)
        } else {
            0
        };
        let wait_order = policy.wait_order().map(|w| {
            let order = LoadOrder::new(w, seed ^ 0x5eed);
            let underused_priced = config.underused_share > 0.0;
            (w, Arc::new(if underused_priced { order.with_demand() } else { order }))
        });
        let session_bookings = (config.book_session_s > 0.0 && policy.prefix_source() == PrefixSource::Events)
            .then(|| SessionBookings::new((config.book_session_s * 10.0).ceil() as Tick));
        Ok(Router {
            policy_name: policy_name.to_string(),
            source: policy.prefix_source(),
            wait_order,
            shortlist_from: SHORTLIST_FROM,
            policy,
            events: EventIndex::new(config.max_blocks),
            routed: RoutedIndex::new(config.max_blocks),
            ttl: ((config.routed_ttl_s * 10.0).ceil() as Tick).max(1),
            book: (config.book_routed_s * 10.0).ceil() as Tick,
            book_cold: (config.book_cold_s * 10.0).ceil() as Tick,
            session_bookings,
            residents: (config.resident_session_tokens > 0)
                .then(|| Residents::new((config.resident_window_s * 10.0).ceil() as Tick)),
            demand_window,
            pool_recent: RecentRequests::default(),
            config,
            table: RwLock::new(Table::default()),
            rng: Rng::new(seed),
            epoch: Instant::now(),
        })
    }

    pub fn policy_name(&self) -> &str {
        &self.policy_name
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Replaces the endpoint set: `(name, block size)` pairs, block size 0 when not yet known (it
    /// is then learned from the endpoint's KV events). A name is an engine address, or
    /// `"{address}#{rank}"` for each data-parallel rank of an engine with more than one. Endpoints that
    /// stay keep their state; new ones start healthy with no load; removed ones are forgotten by both
    /// indexes.
    pub fn set_endpoints(&self, endpoints: Vec<(String, u32)>) -> Result<(), RoutingError> {
        let wanted: HashMap<&str, u32> = endpoints.iter().map(|(a, b)| (a.as_str(), *b)).collect();
        if wanted.len() > MAX_ENDPOINTS {
            return Err(RoutingError::TooManyEndpoints {
                max: MAX_ENDPOINTS,
                got: wanted.len(),
            });
        }
        let removed = {
            let mut t = self.write_table();
            let gone: Vec<EndpointId> = t
                .by_address
                .iter()
                .filter(|(a, _)| !wanted.contains_key(&***a))
                .map(|(_, &id)| id)
                .collect();
            for &id in &gone {
                if let Some(st) = t.slots[id].take() {
                    if st.healthy() {
                        self.leaves_pool(&st, true);
                    }
                    t.by_address.remove(&st.address);
                    if let Some((_, order)) = &self.wait_order {
                        order.remove(&st);
                    }
                }
                t.retired.insert(id);
            }
            let mut free_from = 0;
            for (address, &block_size) in &wanted {
                if let Some(st) = t.get(address) {
                    if block_size != 0 {
                        st.set_block_size(block_size);
                    }
                    continue;
                }
                // Ids below `free_from` are taken (the search resumes there for the next endpoint).
                let id = (free_from..MAX_ENDPOINTS)
                    .find(|&i| t.slots.get(i).is_none_or(|s| s.is_none()) && !t.retired.contains(i))
                    .ok_or(RoutingError::TooManyEndpoints {
                        max: MAX_ENDPOINTS,
                        got: wanted.len(),
                    })?;
                free_from = id + 1;
                if t.slots.len() <= id {
                    t.slots.resize(id + 1, None);
                }
                let mut st = EndpointState::new(address, id, block_size, self.config.max_engine_blocks);
                if self.config.prefill_progress {
                    st = st.with_prefill_clock();
                }
                if let Some((_, order)) = &self.wait_order {
                    st = st.with_order(order.clone());
                    order.update(&st);
                }
                let st = Arc::new(st);
                t.by_address.insert(st.address.clone(), id);
                t.slots[id] = Some(st);
            }
            t.ranks = t.slots.iter().flatten().filter(|st| st.rank.is_some()).count();
            gone
        };
        // Clearing walks the indexes: done outside the table lock so picks go on meanwhile.
        for &id in &removed {
            self.events.clear(id);
            self.routed.clear(id);
            if let Some(residents) = &self.residents {
                residents.clear(id);
            }
            if let Some(bookings) = &self.session_bookings {
                bookings.clear(id);
            }
        }
        let mut t = self.write_table();
        for &id in &removed {
            t.retired.remove(id);
        }
        Ok(())
    }

    /// Marks an engine (un)healthy, every rank of it; unhealthy endpoints are never picked. False if
    /// unknown.
    pub fn set_health(&self, address: &str, healthy: bool) -> bool {
        let table = self.read_table();
        let mut known = false;
        for st in table.engine(address) {
            if st.set_healthy(healthy) != healthy {
                self.leaves_pool(st, !healthy);
            }
            known = true;
        }
        known
    }

    /// The engine's own load report (a `GetLoads` poll) for its rank `rank` (`None`: an engine of one
    /// rank, or rank 0). False if unknown.
    pub fn set_engine_load(&self, address: &str, rank: Option<u32>, load: &EngineLoad) -> bool {
        self.read_table()
            .resolve(address, rank)
            .map(|st| st.set_engine_load(load))
            .is_some()
    }

    /// The priority of a request of `objective` under this model's objectives.
    pub fn priority(&self, objective: Option<&str>) -> i32 {
        self.config.priority(objective)
    }

    pub fn pick(&self, token_ids: &[u32], session_key: Option<&str>) -> Option<Pick> {
        self.pick_with(&PickRequest {
            token_ids,
            session_key,
            ..Default::default()
        })
    }

    /// `route`, for callers that need no reason.
    pub fn pick_with(&self, req: &PickRequest<'_>) -> Option<Pick> {
        self.route(req).ok()
    }

    /// The endpoint for a request plus ordered fallbacks, or why there is none. The primary is charged
    /// one request and the prompt's tokens until `Pick::in_flight` drops. Only a request of negative
    /// priority is shed; any other queues at the engine.
    pub fn route(&self, req: &PickRequest<'_>) -> Result<Pick, NoRoute> {
        let table = self.read_table();
        let clock = Instant::now();
        let now = self.now();
        let d = match self.shortlist(&table, req, clock, now) {
            Some(d) => d,
            None => self.rank_all(&table, req, clock, now)?,
        };
        let p = d.ranking[0];
        let (st, c) = (d.states[p], &d.candidates[p]);
        // Approximate mode leases what it routed; precise mode with booking books it until the
        // engine's events confirm (the lease runs out; the events index holds it by then), and with
        // cold booking only a prompt no engine's events show.
        let (lease, cold_only) = match self.source {
            PrefixSource::Routed => (self.ttl, false),
            PrefixSource::Events if self.book > 0 => (self.book, false),
            PrefixSource::Events => (self.book_cold, true),
            PrefixSource::None => (0, false),
        };
        if lease > 0 {
            if let Some((_, hashes)) = d.chains.iter().find(|(b, _)| *b == c.block_size) {
                if !cold_only || self.is_cold(hashes, now) {
                    self.routed.record_routed(c.id, hashes, now, lease);
                }
            }
        }
        let session = req.session_key.map(session_hash);
        if let (Some(residents), Some(session)) = (&self.residents, session) {
            residents.routed(session, c.id, now);
        }
        if let (Some(bookings), Some(session)) = (&self.session_bookings, session) {
            if let Some((_, hashes)) = d.chains.iter().find(|(b, _)| *b == c.block_size) {
                bookings.book(session, c.id, c.block_size, hashes, now);
            }
        }
        self.sent(st, u64::from(c.prompt_tokens), now);
        Ok(Pick {
            primary: st.address.clone(),
            fallbacks: self.fallbacks(&d.states, &d.ranking),
            cached_blocks: c.cached_blocks,
            block_size: c.block_size,
            best_cached_blocks: d.candidates.iter().map(|c| c.cached_blocks).max().unwrap_or(0),
            in_flight: InFlight::begin(st.clone(), req.token_ids.len() as u64, u64::from(c.uncached_tokens()))
                .with_probe(st.penalty.picked(clock)),
        })
    }

    /// Ranks every candidate: the healthy endpoints (inside the subset, when one was given), without
    /// those their penalty keeps out while any other is left.
    fn rank_all<'t>(
        &self,
        table: &'t Table,
        req: &PickRequest<'_>,
        clock: Instant,
        now: Tick,
    ) -> Result<Decision<'t>, NoRoute> {
        let mut states: Vec<&Arc<EndpointState>> = Vec::with_capacity(table.by_address.len());
        let mut healthy = 0;
        for st in table.slots.iter().flatten().filter(|st| st.healthy()) {
            healthy += 1;
            let admitted = |s: &[&str]| s.iter().any(|a| *a == &*st.engine || *a == &*st.address);
            if req.subset.is_none_or(admitted) {
                states.push(st);
            }
        }
        // An endpoint that just failed holds no requests and would look idle: skip the ejected ones
        // (and half-open ones whose probe is out) while any other candidate is left.
        if states.iter().any(|st| st.penalty.standing(clock).admits()) {
            states.retain(|st| st.penalty.standing(clock).admits());
        }
        let orders = self.wait_order.as_ref().map(|(_, order)| order.lock());
        let fresh_priced = self.config.fresh_cache_weight.is_some();
        let mut candidates: Vec<Candidate> = Vec::with_capacity(states.len());
        for st in &states {
            let load = st.load();
            let fresh = fresh_priced && st.fresh(&load);
            candidates.push(Candidate {
                id: st.id,
                address_hash: st.address_hash,
                load,
                prompt_tokens: req.token_ids.len() as u32,
                block_size: st.block_size(),
                tie: orders.as_ref().map_or(0, |o| o.tie(st.id)),
                fresh,
                ..Default::default()
            });
        }
        drop(orders);
        if candidates.is_empty() {
            return Err(NoRoute::NoEndpoint);
        }
        if let Some(below) = self.underused_below(req, healthy, now) {
            for (c, st) in candidates.iter_mut().zip(&states) {
                c.underused = st.recent.level() < below;
            }
        }
        if let Some(mean) = self.busy_mean(healthy, now) {
            for (c, st) in candidates.iter_mut().zip(&states) {
                c.busy = busy_share(st.recent.at(now, self.demand_window), mean);
            }
        }
        if let Some(residents) = &self.residents {
            let own = req.session_key.map(session_hash);
            if let Some(counts) = residents.for_new_session(candidates.iter().map(|c| c.id), own, now) {
                for (c, n) in candidates.iter_mut().zip(counts) {
                    c.residents = n;
                }
            }
        }
        if self.may_shed(req)
            && candidates
                .iter()
                .all(|c| c.load.queue() >= self.config.shed_queue_depth)
        {
            return Err(NoRoute::Overloaded);
        }
        let chains = self.match_prompt(req, &mut candidates, healthy, now);

        // The primary and its fallbacks are all a pick uses: with every endpoint its own engine they are
        // the first 1 + max_fallbacks of the ranking; ranks of one engine share fallbacks, so then the
        // whole ranking is walked.
        let wanted = if states.iter().any(|st| st.rank.is_some()) {
            candidates.len()
        } else {
            1 + self.config.max_fallbacks
        };
        self.credit_progress(&states, &mut candidates);
        let ranking = self.rank(&candidates, req, wanted);
        Ok(Decision {
            states,
            candidates,
            ranking,
            chains,
        })
    }

    /// Ranks a shortlist (`load_order.rs`): the endpoints holding the prompt's first block, the least
    /// loaded endpoint (the spill gate's minimum), the first `1 + max_fallbacks` candidates holding
    /// none of it in the policy's wait order among those the gate keeps, as many fresh ones when fresh
    /// endpoints are priced, as many underused ones (in wait order) when those are, and as many
    /// spilled ones in load order when the kept ones are too few. The
    /// policy orders each group as those orders do (`WaitOrder`), so the shortlist's first
    /// `1 + max_fallbacks` are every candidate's: the same decision as `rank_all` (router_tests:
    /// `a_shortlist_decides_as_ranking_every_endpoint`).
    ///
    /// `None` (rank every endpoint) where that would not hold or not pay: a policy without a wait
    /// order, fewer than `shortlist_from` healthy endpoints, a subset hint (it may exclude most of
    /// them), data-parallel ranks (their fallbacks walk the whole ranking), a sheddable request
    /// (shedding reads every queue), no endpoint that its penalty lets in, or more than
    /// `SHORTLIST_SKIPS` ejected or spilled endpoints in the way, or resident sessions priced (the
    /// load order does not include them).
    fn shortlist<'t>(
        &self,
        table: &'t Table,
        req: &PickRequest<'_>,
        clock: Instant,
        now: Tick,
    ) -> Option<Decision<'t>> {
        let (wait, order) = self.wait_order.as_ref()?;
        if req.subset.is_some() || self.residents.is_some() || table.ranks > 0 || self.may_shed(req) {
            return None;
        }
        let mut orders = order.lock();
        if orders.len() < self.shortlist_from {
            return None;
        }
        let below = self.underused_below(req, orders.len(), now);
        if let Some(below) = below {
            orders.cut_underused(below);
        }
        // An endpoint's share of recent requests above the mean (`busy_miss_weight`), from its level.
        let busy_mean = self.busy_mean(orders.len(), now);
        let window = self.demand_window;
        let busy = |e: &Entry| busy_mean.map_or(0.0, |m| busy_share(demand::count_at(e.recent, now, window), m));
        let state = |id: EndpointId| table.slots.get(id).and_then(Option::as_ref);
        // Listed endpoints are healthy; a candidate is one its penalty lets in (some is, or `None`):
        // only the standing of one with failures on record depends on the time.
        let admitted = |id| {
            orders
                .entry(id)
                .is_some_and(|e| !e.failing || state(id).is_some_and(|st| st.penalty.standing(clock).admits()))
        };
        let mut skips = SHORTLIST_SKIPS;
        let mut skip = || {
            skips = skips.checked_sub(1)?;
            Some(())
        };
        let mut least = None;
        for (id, requests) in orders.by_load(0) {
            if admitted(id) {
                least = Some((id, requests));
                break;
            }
            skip()?;
        }
        let (least, min) = least?;
        let spilled_from = wait.gate.first_spilled(min);
        let kept = |requests: u32| spilled_from.is_none_or(|s| requests < s);

        let sizes: Vec<u32> = orders.block_sizes().filter(|&b| b > 0).collect();
        let (chains, holders) = self.match_holders(req, &sizes, now, orders.len(), |id, bs| {
            orders.entry(id).is_some_and(|e| e.block_size == bs) && admitted(id)
        });
        let holds = |id| {
            holders
                .binary_search_by_key(&id, |&(h, _)| h)
                .ok()
                .map(|i| holders[i].1)
        };

        let k = 1 + self.config.max_fallbacks;
        let mut ids: Vec<EndpointId> = holders.iter().map(|&(id, _)| id).collect();
        ids.push(least);
        // The first k endpoints of a walk (with the requests the gate counts) that hold nothing of the
        // prompt (ranked by their own keys, the holders are all in already), that the gate keeps, their
        // penalty lets in and that are not busy; how many it found. The busy ones passed on the way are
        // listed too (each a skip): their misses weigh more, so they rank at or below where the walk
        // met them, and every endpoint after the k-th ranks below it.
        let mut first_kept = |walk: &mut dyn Iterator<Item = (EndpointId, u32)>, ids: &mut Vec<EndpointId>| {
            let mut found = 0;
            for (id, requests) in walk {
                if found == k {
                    break;
                }
                if holds(id).is_some() {
                    continue;
                }
                if !kept(requests) || !admitted(id) {
                    skip()?;
                    continue;
                }
                ids.push(id);
                if orders.entry(id).is_some_and(|e| busy(e) > 0.0) {
                    skip()?;
                    continue;
                }
                found += 1;
            }
            Some(found)
        };
        let found = first_kept(&mut orders.by_wait(), &mut ids)?;
        // Underused endpoints rank by their wait alone (uncached tokens count 0 there).
        if below.is_some() {
            first_kept(&mut orders.underused_by_wait(), &mut ids)?;
        }
        // The first k endpoints of a walk that hold nothing of the prompt and that their penalty lets in.
        let mut first_k = |walk: &mut dyn Iterator<Item = EndpointId>, ids: &mut Vec<EndpointId>| {
            let mut taken = 0;
            for id in walk {
                if taken == k {
                    break;
                }
                if holds(id).is_some() {
                    continue; // in already
                }
                if !admitted(id) {
                    skip()?;
                    continue;
                }
                ids.push(id);
                taken += 1;
            }
            Some(())
        };
        // Fresh endpoints rank by their own weight, ahead of others as loaded: the first k of them.
        let fresh_priced = self.config.fresh_cache_weight.is_some();
        if fresh_priced {
            first_k(&mut orders.fresh_by_wait(), &mut ids)?;
        }
        if let (true, Some(from)) = (found < k, spilled_from) {
            first_k(&mut orders.by_load(from).map(|(id, _)| id), &mut ids)?;
        }
        ids.sort_unstable();
        ids.dedup();

        let mut states = Vec::with_capacity(ids.len());
        let mut candidates = Vec::with_capacity(ids.len());
        // Loads as the orders last saw them (the endpoints' own counters agree, but for updates
        // under way).
        for id in ids {
            let (st, e) = (state(id)?, orders.entry(id)?);
            let prompt_blocks = chains
                .iter()
                .find(|(b, _)| *b == e.block_size)
                .map_or(0, |(_, h)| h.len());
            candidates.push(Candidate {
                id,
                address_hash: e.address_hash,
                load: e.load,
                cached_blocks: holds(id).unwrap_or(0),
                prompt_blocks: prompt_blocks as u32,
                prompt_tokens: req.token_ids.len() as u32,
                block_size: e.block_size,
                tie: e.tie,
                residents: 0,
                fresh: fresh_priced && e.fresh,
                underused: below.is_some_and(|b| e.recent < b),
                busy: busy(e),
            });
            states.push(st);
        }
        drop(orders);
        self.credit_progress(&states, &mut candidates);
        let ranking = self.rank(&candidates, req, k);
        Some(Decision {
            states,
            candidates,
            ranking,
            chains,
        })
    }

    /// With `prefill_progress`, each candidate holding part of the prompt has its own prefill backlog
    /// less what it has done of it since its current prefill began (`prefill_progress.rs`). Only the
    /// holders: the load order cannot follow time, and a shortlist ranks every holder but only the
    /// first of the rest by their keys there, so crediting those too would decide unlike ranking every
    /// endpoint; what progress does is keep a hit on its holder, which needs the holders alone.
    fn credit_progress(&self, states: &[&Arc<EndpointState>], candidates: &mut [Candidate]) {
        if !self.config.prefill_progress {
            return;
        }
        let now = prefill_progress::now_us();
        for (c, st) in candidates.iter_mut().zip(states) {
            if c.cached_blocks > 0 && c.load.prefill_tokens > 0 {
                c.load.prefill_tokens = st.prefill_clock.remaining(c.load.prefill_tokens, now);
            }
        }
    }

    fn rank(&self, candidates: &[Candidate], req: &PickRequest<'_>, wanted: usize) -> Vec<usize> {
        self.policy.rank_top(
            &PickContext {
                candidates,
                session_key: req.session_key,
                rng: &self.rng,
            },
            wanted,
        )
    }

    /// The level of recent requests (`demand.rs`) below which an endpoint is underused for this
    /// request: `underused_share` of the mean over the `healthy` endpoints. `None` when none is: the
    /// setting is off, the request is a follow-up (its session has a live booking: it follows its
    /// history), or the mean is below `DEMAND_MIN_MEAN`.
    fn underused_below(&self, req: &PickRequest<'_>, healthy: usize, now: Tick) -> Option<f64> {
        if self.config.underused_share == 0.0 {
            return None;
        }
        if let (Some(bookings), Some(key)) = (&self.session_bookings, req.session_key) {
            if bookings.live(session_hash(key), now) {
                return None;
            }
        }
        self.recent_mean(healthy, now)
            .map(|mean| demand::level_of(self.config.underused_share * mean, now, self.demand_window))
    }

    /// The healthy endpoints' mean recent requests when busy endpoints are priced (`busy_miss_weight`):
    /// `None` when they are not, or the mean is below `DEMAND_MIN_MEAN`.
    fn busy_mean(&self, healthy: usize, now: Tick) -> Option<f64> {
        (self.config.busy_miss_weight > 0.0)
            .then(|| self.recent_mean(healthy, now))
            .flatten()
    }

    /// The mean recent requests (`demand.rs`) over the `healthy` endpoints, when they are counted and it
    /// is at least `DEMAND_MIN_MEAN`.
    fn recent_mean(&self, healthy: usize, now: Tick) -> Option<f64> {
        if self.demand_window == 0 || healthy == 0 {
            return None;
        }
        let mean = self.pool_recent.at(now, self.demand_window) / healthy as f64;
        (mean >= DEMAND_MIN_MEAN).then_some(mean)
    }

    /// `st` leaves the healthy pool (`leaves`) or rejoins it: the pool's recent requests lose or regain
    /// its count.
    fn leaves_pool(&self, st: &EndpointState, leaves: bool) {
        if self.demand_window > 0 {
            let now = self.now();
            let count = st.recent.at(now, self.demand_window);
            let sign = if leaves { -1.0 } else { 1.0 };
            self.pool_recent.add(sign * count, now, self.demand_window);
        }
    }

    /// Whether the request is shed when every candidate's queue is full.
    fn may_shed(&self, req: &PickRequest<'_>) -> bool {
        self.config.shed_queue_depth > 0 && self.priority(req.objective) < 0
    }

    /// How an engine call on rank `rank` of the engine at `address` ended (`Err`: how it failed), for
    /// the endpoint's penalty (`penalty.rs`). False if unknown.
    pub fn report(&self, address: &str, rank: Option<u32>, outcome: Result<(), Failure>) -> bool {
        let table = self.read_table();
        let Some(st) = table.resolve(address, rank).or_else(|| table.resolve(address, None)) else {
            return false;
        };
        match outcome {
            Ok(()) => st.penalty.succeeded(),
            Err(failure) => st.penalty.failed(failure, Instant::now()),
        }
        if let Some((_, order)) = &self.wait_order {
            order.update(st);
        }
        true
    }

    /// The other engines after the primary, best first: each engine's address once (at its best
    /// ranked endpoint), never the primary's engine, and for a primary that is a rank only engines
    /// with that rank (the request is pinned to it). At most `max_fallbacks`.
    fn fallbacks(&self, states: &[&Arc<EndpointState>], ranking: &[usize]) -> Vec<Arc<str>> {
        let primary = states[ranking[0]];
        let mut out: Vec<Arc<str>> = Vec::new();
        for &i in &ranking[1..] {
            if out.len() >= self.config.max_fallbacks {
                break;
            }
            let st = states[i];
            let pinned_elsewhere = primary.rank.is_some_and(|r| st.rank != Some(r));
            if st.engine == primary.engine || pinned_elsewhere || out.contains(&st.engine) {
                continue;
            }
            out.push(st.engine.clone());
        }
        out
    }

    /// Fills each candidate's cached and prompt blocks from the policy's index, hashing the prompt
    /// once per distinct block size; returns the chains.
    fn match_prompt(&self, req: &PickRequest<'_>, candidates: &mut [Candidate], healthy: usize, now: Tick) -> Chains {
        // Distinct block sizes (one, nearly always).
        let mut sizes: Vec<u32> = candidates.iter().map(|c| c.block_size).filter(|&b| b > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        // Candidates are in id order: each holder is found by bisection.
        let find = |id: EndpointId| candidates.binary_search_by_key(&id, |c| c.id).ok();
        let (chains, holders) = self.match_holders(req, &sizes, now, healthy, |id, bs| {
            find(id).is_some_and(|i| candidates[i].block_size == bs)
        });
        for c in candidates.iter_mut() {
            if let Some((_, hashes)) = chains.iter().find(|(b, _)| *b == c.block_size) {
                c.prompt_blocks = hashes.len() as u32;
            }
        }
        for (id, blocks) in holders {
            if let Ok(i) = candidates.binary_search_by_key(&id, |c| c.id) {
                candidates[i].cached_blocks = blocks;
            }
        }
        chains
    }

    /// Whether no endpoint's events show the first block of `hashes` (cold booking's test).
    fn is_cold(&self, hashes: &[BlockHash], now: Tick) -> bool {
        hashes.first().is_none_or(|first| {
            self.events
                .match_prefix_where(std::slice::from_ref(first), |_| true, now)
                .iter()
                .next()
                .is_none()
        })
    }

    /// Booked engines a cold prompt's bookings wait for, `healthy` endpoints being up: the larger of
    /// `book_cold_spread` and `book_cold_spread_share` of them (rounded up).
    fn cold_spread(&self, healthy: usize) -> usize {
        let share = (self.config.book_cold_spread_share * healthy as f64).ceil() as usize;
        (self.config.book_cold_spread as usize).max(share)
    }

    /// The prompt's chain for each of `sizes`, and every endpoint that `is_candidate(id, block size)`
    /// admits holding at least its first block, with the leading blocks it holds (per the policy's
    /// index; with booking, the most of that and what was booked), ascending by id. `healthy`: the
    /// router's healthy endpoints (cold booking's spread).
    fn match_holders(
        &self,
        req: &PickRequest<'_>,
        sizes: &[u32],
        now: Tick,
        healthy: usize,
        is_candidate: impl Fn(EndpointId, u32) -> bool,
    ) -> (Chains, Vec<(EndpointId, u32)>) {
        let mut chains = Vec::with_capacity(sizes.len());
        let mut holders: Vec<(EndpointId, u32)> = Vec::new();
        if self.source == PrefixSource::None {
            return (chains, holders);
        }
        let root = block_hash::root(req.lora_name, req.cache_salt);
        let session = self.session_bookings.as_ref().and(req.session_key).map(session_hash);
        for &bs in sizes {
            let hashes = block_hash::prompt_hashes(req.token_ids, bs as usize, root);
            let of_size = |id| is_candidate(id, bs);
            let counts = match self.source {
                PrefixSource::Events => self.events.match_prefix_where(&hashes, of_size, now),
                _ => self.routed.match_prefix_where(&hashes, of_size, now),
            };
            holders.extend(counts.iter());
            // Booked blocks (precise mode): what was just routed there, not yet in its events.
            if self.source == PrefixSource::Events && (self.book > 0 || self.book_cold > 0) {
                let booked = self.routed.match_prefix_where(&hashes, of_size, now);
                // Cold bookings count once `cold_spread` engines hold one: until then the burst goes
                // where the load says, each such pick booking another engine.
                if self.book > 0 || booked.iter().count() >= self.cold_spread(healthy) {
                    holders.extend(booked.iter());
                }
            }
            // The session's own booking: its last request's prompt, where that went.
            if let (Some(bookings), Some(session)) = (&self.session_bookings, session) {
                if let Some((id, blocks)) = bookings.held(session, bs, &hashes, now) {
                    if of_size(id) {
                        holders.push((id, blocks));
                    }
                }
            }
            chains.push((bs, hashes));
        }
        // One entry per endpoint, its most blocks (sorted by id, then blocks: the last of each id).
        holders.sort_unstable();
        holders.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = later.1;
            }
            same
        });
        (chains, holders)
    }

    /// Counts a request in flight on the engine at `address` until the returned guard drops (for a
    /// request the caller sent to a fallback; its whole prompt counts as prefill work): on its rank
    /// `rank` (the request's pin) when it has that rank, else on its rank 0. `None` if unknown.
    pub fn begin(&self, address: &str, rank: Option<u32>, tokens: u64) -> Option<InFlight> {
        let table = self.read_table();
        table
            .resolve(address, rank)
            .or_else(|| table.resolve(address, None))
            .map(|st| {
                self.sent(st, tokens, self.now());
                InFlight::begin(st.clone(), tokens, tokens)
            })
    }

    /// A prompt of `prompt_tokens` goes to `st`, as a pick's primary or a fallback that answered: its
    /// freshness (`EndpointState::sent_prompt`), and its recent requests when underused endpoints are
    /// priced.
    fn sent(&self, st: &EndpointState, prompt_tokens: u64, now: Tick) {
        st.sent_prompt(prompt_tokens);
        if self.demand_window > 0 {
            st.recent.add(1.0, now, self.demand_window);
            self.pool_recent.add(1.0, now, self.demand_window);
        }
    }

    /// Applies one `KvEventBatch` (protobuf bytes) from the event stream of the engine at `address`, and
    /// the load record it carries, to the endpoint of the batch's `dp_rank` (rank 0 when absent; the
    /// engine itself when it has one rank). Each rank numbers its own batches. On `needs_resync()` the
    /// caller tears the stream down, calls `reset_kv_events`, and subscribes again from sequence 0.
    pub fn apply_kv_events(&self, address: &str, batch: &[u8]) -> BatchResult {
        // Decoded before any lock is taken: picks never wait on protobuf.
        let batch = match KvEventBatch::decode(batch) {
            Ok(batch) => batch,
            Err(e) => {
                return BatchResult {
                    outcome: EventOutcome::Malformed(e.to_string()),
                    load: None,
                }
            }
        };
        let result = self.apply_events(address, batch_rank(&batch), |state, index, id| {
            state.apply_batch(index, id, &batch, OnGap::Break)
        });
        metrics::global().kv_batch(address, result.outcome.kind(), batch.timestamp);
        result
    }

    /// Applies one message of vLLM's ZMQ KV-event channel from `address` (its sequence frame and msgpack
    /// payload; `zmq_events.rs`), sharing the endpoint's event state with `apply_kv_events`. A gap leaves
    /// the endpoint as it was: the caller replays the missing sequences and offers this message again, or
    /// calls `reset_kv_events`. `malformed` also needs a reset (the batch's events are lost). The batch
    /// goes to the endpoint of its `dp_rank` as in `apply_kv_events` (a ZMQ publisher is one rank's).
    pub fn apply_zmq_kv_events(&self, address: &str, sequence: u64, payload: &[u8]) -> BatchResult {
        // Decoded before any lock is taken: picks never wait on msgpack.
        let batch = match zmq_events::decode(sequence, payload) {
            Ok(batch) => batch,
            Err(e) => {
                return BatchResult {
                    outcome: EventOutcome::Malformed(e),
                    load: None,
                }
            }
        };
        let result = self.apply_events(address, batch_rank(&batch), |state, index, id| {
            state.apply_batch(index, id, &batch, OnGap::Hold)
        });
        metrics::global().kv_batch(address, result.outcome.kind(), batch.timestamp);
        result
    }

    fn apply_events(
        &self,
        address: &str,
        rank: Option<u32>,
        apply: impl FnOnce(&mut EventState, &EventIndex, EndpointId) -> BatchResult,
    ) -> BatchResult {
        let table = self.read_table();
        let Some(st) = table.resolve(address, rank) else {
            return BatchResult {
                outcome: EventOutcome::UnknownEndpoint,
                load: None,
            };
        };
        let result = {
            let mut events = st.events();
            let result = apply(&mut events, &self.events, st.id);
            st.events_changed(&events);
            result
        };
        if let Some(load) = &result.load {
            st.set_engine_load(load);
        }
        if let EventOutcome::Applied(stats) = &result.outcome {
            if let Some(b) = stats.block_size.filter(|&b| b != st.block_size()) {
                st.set_block_size(b);
            }
        }
        result
    }

    /// Forgets what the events of the engine at `address` said, every rank's, and accepts a new
    /// subscription's first batches. False if unknown.
    pub fn reset_kv_events(&self, address: &str) -> bool {
        metrics::global().kv_resync(address);
        let table = self.read_table();
        let mut known = false;
        for st in table.engine(address) {
            let mut events = st.events();
            events.reset(&self.events, st.id);
            st.events_changed(&events);
            known = true;
        }
        known
    }

    pub fn endpoints(&self) -> Vec<EndpointInfo> {
        let table = self.read_table();
        table
            .slots
            .iter()
            .flatten()
            .map(|st| {
                let ev = st.events();
                EndpointInfo {
                    address: st.address.clone(),
                    healthy: st.healthy(),
                    block_size: st.block_size(),
                    load: st.load(),
                    publishes_events: ev.publishing,
                    engine_blocks: ev.engine_map().len(),
                    nothing_cached: st.nothing_cached(),
                    standing: st.penalty.standing(Instant::now()),
                    failures: st.penalty.failures(),
                }
            })
            .collect()
    }

    pub fn index_stats(&self) -> IndexStats {
        let table = self.read_table();
        let engine_maps: usize = table
            .slots
            .iter()
            .flatten()
            .map(|st| st.events().engine_map().memory_bytes())
            .sum();
        IndexStats {
            event_blocks: self.events.len(),
            routed_blocks: self.routed.len(),
            index_bytes: self.events.memory_bytes(),
            memory_bytes: self.events.memory_bytes() + self.routed.memory_bytes() + engine_maps,
        }
    }

    fn now(&self) -> Tick {
        (self.epoch.elapsed().as_millis() / 100) as Tick
    }

    // A poisoned table means a panic mid-update elsewhere; its maps are still consistent.
    fn read_table(&self) -> RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_table(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// A session key's hash, as `Residents` keys it.
fn session_hash(key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key.as_bytes())
}

/// The data-parallel rank a batch names (`None` when absent or negative).
fn batch_rank(batch: &KvEventBatch) -> Option<u32> {
    batch.dp_rank.and_then(|r| u32::try_from(r).ok())
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "router_shortlist_tests.rs"]
mod shortlist_tests;
