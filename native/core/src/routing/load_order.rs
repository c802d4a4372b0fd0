//! The healthy endpoints of a router in load order, kept up to date on every change of an endpoint's
//! load (a request starting, prefilled or ending; an engine's load report), health or block size, so
//! that a pick over thousands of endpoints reads the few least loaded instead of scanning them all
//! (`Router::route`'s shortlist, issue 13).
//!
//! Two orders of the same entries:
//! - by wait: `prefill_backlog + request_cost x requests`, then the gate's load key (`SpillGate::
//!   load_key`: the requests the spill gate counts, requests, in-flight tokens), tie. This is the
//!   cache-affinity ranking (`policy/affinity.rs`) of the endpoints that hold nothing of the prompt:
//!   their expected wait is this plus `uncached_weight x prompt tokens`, the same term for all of them,
//!   and their cached blocks are all 0, so their ranking keys are ordered as these.
//! - by load: the gate's load key, tie: the least loaded (the spill gate's minimum) and the order of
//!   spilled endpoints, which the ranking orders by that key alone.
//!
//! And the fresh endpoints (nothing cached, nothing on them: `EndpointState::fresh`) by wait: the
//! ranking prices their misses at `fresh_cache_weight`, the same term for all of them, so they too are
//! ordered as these keys.
//!
//! And, when underused endpoints are priced (`with_demand`), the underused ones by wait: the ranking
//! prices their misses at 0, so they too are ordered as these keys. Which are underused changes with
//! time (counts decay, the pool's mean moves): they are the endpoints whose recent requests' level
//! (`demand.rs`) is below a cut, and a third order, every endpoint by level, finds those that cross
//! when a pick moves the cut. Levels do not move with time and the cut moves a little at each pick, so
//! few cross at a time.
//!
//! The tie: a number each endpoint draws anew at every update of its entry. The affinity ranking breaks
//! ties with it (then by id), whichever way the router ranks (shortlist or every endpoint), so the two
//! decide alike; a random draw per pick and endpoint would need every tied endpoint looked at. An
//! endpoint's number changes whenever its load does (picking it starts a request on it), so tied
//! endpoints still take turns.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use super::config::SpillCounts;
use super::endpoint::EndpointState;
use super::endpoint_set::EndpointId;
use super::load::Load;
use super::policy::filter::GateLoadKey;
use super::policy::WaitOrder;
use super::rng::Rng;

/// (wait, the gate's load key, tie, id).
type WaitKey = (u64, GateLoadKey, u64, EndpointId);
/// (the gate's load key, tie, id).
type LoadKey = (GateLoadKey, u64, EndpointId);
/// (recent requests' level as `ordered` bits, id): below `(ordered(cut), 0)` is below the cut.
type RecentKey = (u64, EndpointId);

/// `x`'s bits in an order that sorts as the numbers do: a negative number's flipped whole, a positive
/// one's with its sign bit set.
fn ordered(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// An endpoint's expected wait before the request's own prefill, in tokens: its prefill backlog plus
/// `request_cost` per request on it (`policy/affinity.rs` adds the request's uncached tokens).
pub fn base_wait(load: &Load, request_cost: u32) -> u64 {
    load.prefill_backlog() + u64::from(request_cost) * u64::from(load.requests())
}

/// A listed endpoint as of its last update: what a shortlist reads of it, without reaching for the
/// endpoint itself (thousands of them are scattered over the heap; the entries are one array).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    pub load: Load,
    pub address_hash: u64,
    pub tie: u64,
    pub block_size: u32,
    /// It has failures on record (`Penalty::failing`): its standing needs a look.
    pub failing: bool,
    /// Nothing cached and nothing on it (`EndpointState::fresh`).
    pub fresh: bool,
    /// Its recent requests' level (`demand.rs`; `-inf` when they are not counted).
    pub recent: f64,
    wait: u64,
    /// `SpillGate::load_key` of its load.
    gate_key: GateLoadKey,
}

impl Entry {
    fn wait_key(&self, id: EndpointId) -> WaitKey {
        (self.wait, self.gate_key, self.tie, id)
    }

    fn load_key(&self, id: EndpointId) -> LoadKey {
        (self.gate_key, self.tie, id)
    }

    fn recent_key(&self, id: EndpointId) -> RecentKey {
        (ordered(self.recent), id)
    }
}

/// The orders of one router's endpoints, behind one lock.
pub struct LoadOrder {
    /// The policy's request cost (the wait) and spill gate (whose count leads the load keys).
    order: WaitOrder,
    orders: Mutex<Orders>,
}

/// The orders of `underused_share` (`LoadOrder::with_demand`).
struct Demand {
    /// Listed endpoints by their recent requests, fewest first.
    by_recent: BTreeSet<RecentKey>,
    /// The level below which an endpoint is underused, as of the last pick that priced them.
    cut: f64,
    /// The listed endpoints below `cut`, by wait.
    below_by_wait: BTreeSet<WaitKey>,
}

pub struct Orders {
    /// Listed endpoints (present and healthy), by id.
    entries: Vec<Option<Entry>>,
    by_wait: BTreeSet<WaitKey>,
    by_load: BTreeSet<LoadKey>,
    /// The fresh ones of `by_wait`.
    fresh: BTreeSet<WaitKey>,
    /// The underused endpoints by wait (`None`: not kept, underused endpoints are not priced).
    demand: Option<Demand>,
    /// Listed endpoints per block size.
    block_sizes: BTreeMap<u32, usize>,
    ties: Rng,
}

impl LoadOrder {
    /// `order`: the affinity policy's request cost and spill gate; `seed`: of the tie draws.
    pub fn new(order: WaitOrder, seed: u64) -> Self {
        LoadOrder {
            order,
            orders: Mutex::new(Orders {
                entries: Vec::new(),
                by_wait: BTreeSet::new(),
                by_load: BTreeSet::new(),
                fresh: BTreeSet::new(),
                demand: None,
                block_sizes: BTreeMap::new(),
                ties: Rng::new(seed),
            }),
        }
    }

    /// Keeps the underused endpoints by wait as well (`Orders::underused_by_wait`).
    pub fn with_demand(self) -> Self {
        self.lock().demand = Some(Demand {
            by_recent: BTreeSet::new(),
            cut: f64::NEG_INFINITY,
            below_by_wait: BTreeSet::new(),
        });
        self
    }

    /// Brings `st`'s entry up to date with its load, health, block size and penalty (read under the
    /// lock, so the last of concurrent updates leaves the latest values), drawing it a new tie. An unhealthy
    /// endpoint is unlisted; a removed one (`remove`) is left alone: its id may be another's by now.
    pub fn update(&self, st: &EndpointState) {
        let mut o = self.lock();
        if st.is_removed() {
            return;
        }
        o.unlist(st.id);
        if st.healthy() {
            let load = st.load();
            let entry = Entry {
                wait: base_wait(&load, self.order.request_cost),
                gate_key: self.order.gate.load_key(&load),
                load,
                address_hash: st.address_hash,
                tie: o.ties.next_u64(),
                block_size: st.block_size(),
                failing: st.penalty.failing(),
                fresh: st.fresh(&load),
                recent: st.recent.level(),
            };
            o.list(st.id, entry);
        }
    }

    /// Whether the keys count prefilling requests (`spill_counts = "prefilling"`): only then does a
    /// request's first token move its endpoint when it had no prefill tokens counted.
    pub fn counts_prefilling(&self) -> bool {
        self.order.gate.counts == SpillCounts::Prefilling
    }

    /// `st` left the router: unlisted, and its later updates (requests still in flight) ignored.
    pub fn remove(&self, st: &EndpointState) {
        let mut o = self.lock();
        if !st.is_removed() {
            st.mark_removed();
            o.unlist(st.id);
        }
    }

    // A poisoned lock means a panic mid-update; the next update of each endpoint rewrites its entry.
    pub fn lock(&self) -> MutexGuard<'_, Orders> {
        self.orders.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Orders {
    fn unlist(&mut self, id: EndpointId) {
        let Some(e) = self.entries.get_mut(id).and_then(Option::take) else {
            return;
        };
        self.by_wait.remove(&e.wait_key(id));
        self.by_load.remove(&e.load_key(id));
        if e.fresh {
            self.fresh.remove(&e.wait_key(id));
        }
        if let Some(d) = &mut self.demand {
            d.by_recent.remove(&e.recent_key(id));
            if e.recent < d.cut {
                d.below_by_wait.remove(&e.wait_key(id));
            }
        }
        if let Some(n) = self.block_sizes.get_mut(&e.block_size) {
            *n -= 1;
            if *n == 0 {
                self.block_sizes.remove(&e.block_size);
            }
        }
    }

    fn list(&mut self, id: EndpointId, e: Entry) {
        if self.entries.len() <= id {
            self.entries.resize(id + 1, None);
        }
        self.entries[id] = Some(e);
        self.by_wait.insert(e.wait_key(id));
        self.by_load.insert(e.load_key(id));
        if e.fresh {
            self.fresh.insert(e.wait_key(id));
        }
        if let Some(d) = &mut self.demand {
            d.by_recent.insert(e.recent_key(id));
            if e.recent < d.cut {
                d.below_by_wait.insert(e.wait_key(id));
            }
        }
        *self.block_sizes.entry(e.block_size).or_default() += 1;
    }

    /// Listed endpoints.
    pub fn len(&self) -> usize {
        self.by_load.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_load.is_empty()
    }

    /// The endpoint's tie (0 when not listed).
    pub fn tie(&self, id: EndpointId) -> u64 {
        self.entry(id).map_or(0, |e| e.tie)
    }

    /// The endpoint's entry, when listed.
    pub fn entry(&self, id: EndpointId) -> Option<&Entry> {
        self.entries.get(id).and_then(Option::as_ref)
    }

    /// `(id, requests the gate counts)` by wait, least first.
    pub fn by_wait(&self) -> impl Iterator<Item = (EndpointId, u32)> + '_ {
        self.by_wait.iter().map(|&(_, (gated, ..), _, id)| (id, gated))
    }

    /// The fresh endpoints' ids by wait, least first.
    pub fn fresh_by_wait(&self) -> impl Iterator<Item = EndpointId> + '_ {
        self.fresh.iter().map(|&(.., id)| id)
    }

    /// Moves the underused endpoints' cut to `level` (`demand.rs`): those whose recent requests'
    /// level is below it are underused. Only the endpoints between the old cut and the new move.
    pub fn cut_underused(&mut self, level: f64) {
        let Some(d) = &mut self.demand else {
            return;
        };
        let (low, high) = (d.cut.min(level), d.cut.max(level));
        let crossing: Vec<EndpointId> = d
            .by_recent
            .range((ordered(low), 0)..(ordered(high), 0))
            .map(|&(_, id)| id)
            .collect();
        for id in crossing {
            let Some(e) = self.entries.get(id).and_then(Option::as_ref) else {
                continue;
            };
            if level > d.cut {
                d.below_by_wait.insert(e.wait_key(id));
            } else {
                d.below_by_wait.remove(&e.wait_key(id));
            }
        }
        d.cut = level;
    }

    /// `(id, requests the gate counts)` of the underused endpoints (below the last cut) by wait, least
    /// first; none when not kept (`LoadOrder::with_demand`).
    pub fn underused_by_wait(&self) -> impl Iterator<Item = (EndpointId, u32)> + '_ {
        self.demand
            .iter()
            .flat_map(|d| d.below_by_wait.iter())
            .map(|&(_, (gated, ..), _, id)| (id, gated))
    }

    /// `(id, requests the gate counts)` by load (the gate's load key) from `min_requests` gated
    /// requests on, least first.
    pub fn by_load(&self, min_requests: u32) -> impl Iterator<Item = (EndpointId, u32)> + '_ {
        self.by_load
            .range(((min_requests, 0, 0), 0, 0)..)
            .map(|&((gated, ..), _, id)| (id, gated))
    }

    /// The distinct block sizes of the listed endpoints, ascending (0: unknown).
    pub fn block_sizes(&self) -> impl Iterator<Item = u32> + '_ {
        self.block_sizes.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::routing::demand::level_of;
    use crate::routing::endpoint::InFlight;
    use crate::routing::load::EngineLoad;
    use crate::routing::policy::filter::SpillGate;

    /// The load order of an affinity policy with `request_cost` and the default spill gate.
    fn order(request_cost: u32) -> WaitOrder {
        WaitOrder {
            request_cost,
            gate: SpillGate {
                enabled: true,
                abs: 8,
                ratio: 1.5,
                counts: SpillCounts::Requests,
            },
        }
    }

    fn endpoint(order: &Arc<LoadOrder>, id: EndpointId, block_size: u32) -> Arc<EndpointState> {
        let st =
            Arc::new(EndpointState::new(&format!("10.0.0.{id}:8000"), id, block_size, 8).with_order(order.clone()));
        order.update(&st);
        st
    }

    fn waits(order: &LoadOrder) -> Vec<(EndpointId, u32)> {
        order.lock().by_wait().collect()
    }

    fn loads(order: &LoadOrder) -> Vec<EndpointId> {
        order.lock().by_load(0).map(|(id, _)| id).collect()
    }

    #[test]
    fn requests_starting_prefilled_and_ending_move_their_endpoint() {
        let order = Arc::new(LoadOrder::new(order(16), 1));
        let a = endpoint(&order, 0, 16);
        let b = endpoint(&order, 1, 16);
        // A: one request with 100 tokens to prefill (wait 100 + 16); B idle.
        let mut on_a = InFlight::begin(a.clone(), 300, 100);
        assert_eq!(waits(&order), vec![(1, 0), (0, 1)]);
        assert_eq!(loads(&order), vec![1, 0]);
        // B: two requests, nothing to prefill (wait 32): B now waits less than A but is more loaded.
        let on_b = [InFlight::begin(b.clone(), 10, 0), InFlight::begin(b.clone(), 10, 0)];
        assert_eq!(waits(&order), vec![(1, 2), (0, 1)]);
        assert_eq!(loads(&order), vec![0, 1]);
        // A's first token: its backlog is gone (wait 16).
        on_a.first_token();
        assert_eq!(waits(&order), vec![(0, 1), (1, 2)]);
        drop(on_b);
        assert_eq!(waits(&order), vec![(1, 0), (0, 1)]);
        drop(on_a);
        assert_eq!(order.lock().by_load(0).map(|(_, r)| r).collect::<Vec<_>>(), vec![0, 0]);
    }

    #[test]
    fn engine_reports_count_as_the_ranking_counts_them() {
        let order = Arc::new(LoadOrder::new(order(16), 1));
        let a = endpoint(&order, 0, 16);
        let b = endpoint(&order, 1, 16);
        let _ours = InFlight::begin(b.clone(), 10, 0);
        // A reports 3 requests and 500 queued uncached tokens: 500 + 48 against B's 16.
        a.set_engine_load(&EngineLoad {
            running: 2,
            waiting: 1,
            waiting_uncached_tokens: 500,
            ..Default::default()
        });
        assert_eq!(waits(&order), vec![(1, 1), (0, 3)]);
        assert_eq!(
            order.lock().by_load(2).collect::<Vec<_>>(),
            vec![(0, 3)],
            "from 2 requests on"
        );
    }

    #[test]
    fn unhealthy_endpoints_are_unlisted_until_healthy_again() {
        let order = Arc::new(LoadOrder::new(order(16), 1));
        let a = endpoint(&order, 0, 16);
        let _b = endpoint(&order, 1, 32);
        assert_eq!(order.lock().block_sizes().collect::<Vec<_>>(), vec![16, 32]);
        a.set_healthy(false);
        assert_eq!((loads(&order), order.lock().len()), (vec![1], 1));
        assert_eq!(order.lock().block_sizes().collect::<Vec<_>>(), vec![32]);
        // A request ending on an unhealthy endpoint does not list it.
        drop(InFlight::begin(a.clone(), 5, 5));
        assert_eq!(loads(&order), vec![1]);
        a.set_healthy(true);
        assert_eq!(loads(&order).len(), 2);
        a.set_block_size(32);
        assert_eq!(order.lock().block_sizes().collect::<Vec<_>>(), vec![32]);
    }

    #[test]
    fn a_removed_endpoint_leaves_its_id_to_the_next() {
        let order = Arc::new(LoadOrder::new(order(16), 1));
        let old = endpoint(&order, 0, 16);
        let late = InFlight::begin(old.clone(), 5, 5);
        order.remove(&old);
        assert!(order.lock().is_empty());
        // Id 0 is reused; the removed endpoint's request ends afterwards and must not touch it.
        let new = endpoint(&order, 0, 16);
        let tie = order.lock().tie(0);
        drop(late);
        assert_eq!(waits(&order), vec![(0, 0)]);
        assert_eq!(order.lock().tie(0), tie, "the new endpoint's entry is untouched");
        drop(new);
    }

    #[test]
    fn the_underused_endpoints_follow_the_cut_in_wait_order() {
        let order = Arc::new(LoadOrder::new(order(16), 1).with_demand());
        let eps: Vec<_> = (0..3).map(|i| endpoint(&order, i, 16)).collect();
        // 3, 0 and 1 requests lately; the next update lists the counts. Endpoint 2 has a request on it.
        for (st, n) in eps.iter().zip([3, 0, 1]) {
            for _ in 0..n {
                st.recent.add(1.0, 10, 50);
            }
            order.update(st);
        }
        let _on_2 = InFlight::begin(eps[2].clone(), 10, 0);
        let below = |count| {
            let mut o = order.lock();
            o.cut_underused(level_of(count, 10, 50));
            o.underused_by_wait().map(|(id, _)| id).collect::<Vec<_>>()
        };
        assert_eq!(below(2.0), vec![1, 2], "by wait");
        assert_eq!(below(0.5), vec![1], "the cut lowered");
        assert_eq!(below(5.0).len(), 3, "raised past all");
        assert_eq!(below(1.0), vec![1]);
        // Ten windows later the counts have faded: the same count is a higher level, all are below it.
        let mut o = order.lock();
        o.cut_underused(level_of(1.0, 510, 50));
        assert_eq!(o.underused_by_wait().count(), 3);
        o.cut_underused(level_of(2.0, 10, 50));
        drop(o);
        // A request ending on 2 moves it in the wait order; more requests on 1 move it past the cut.
        drop(_on_2);
        assert_eq!(
            order
                .lock()
                .underused_by_wait()
                .map(|(id, _)| id)
                .collect::<Vec<_>>()
                .len(),
            2
        );
        for _ in 0..4 {
            eps[1].recent.add(1.0, 10, 50);
        }
        order.update(&eps[1]);
        assert_eq!(
            order.lock().underused_by_wait().map(|(id, _)| id).collect::<Vec<_>>(),
            vec![2]
        );
        // An unhealthy endpoint is unlisted.
        eps[2].set_healthy(false);
        assert_eq!(order.lock().underused_by_wait().count(), 0);
        // Without `with_demand` none is kept.
        let plain = Arc::new(LoadOrder::new(self::order(16), 1));
        let _st = endpoint(&plain, 0, 16);
        plain.lock().cut_underused(f64::INFINITY);
        assert_eq!(plain.lock().underused_by_wait().count(), 0);
    }

    #[test]
    fn every_update_draws_a_new_tie() {
        let order = Arc::new(LoadOrder::new(order(16), 1));
        let a = endpoint(&order, 0, 16);
        let first = order.lock().tie(0);
        drop(InFlight::begin(a.clone(), 5, 0));
        assert_ne!(order.lock().tie(0), first);
        assert_eq!(order.lock().tie(7), 0, "not listed");
    }
}
