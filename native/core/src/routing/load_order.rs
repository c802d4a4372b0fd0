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
}

/// The orders of one router's endpoints, behind one lock.
pub struct LoadOrder {
    /// The policy's request cost (the wait) and spill gate (whose count leads the load keys).
    order: WaitOrder,
    orders: Mutex<Orders>,
}

pub struct Orders {
    /// Listed endpoints (present and healthy), by id.
    entries: Vec<Option<Entry>>,
    by_wait: BTreeSet<WaitKey>,
    by_load: BTreeSet<LoadKey>,
    /// The fresh ones of `by_wait`.
    fresh: BTreeSet<WaitKey>,
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
                block_sizes: BTreeMap::new(),
                ties: Rng::new(seed),
            }),
        }
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
    fn every_update_draws_a_new_tie() {
        let order = Arc::new(LoadOrder::new(order(16), 1));
        let a = endpoint(&order, 0, 16);
        let first = order.lock().tie(0);
        drop(InFlight::begin(a.clone(), 5, 0));
        assert_ne!(order.lock().tie(0), first);
        assert_eq!(order.lock().tie(7), 0, "not listed");
    }
}
