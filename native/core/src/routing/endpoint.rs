//! One engine endpoint as the router tracks it: identity, health, block size, loads (atomics, so a
//! pick reads them without locks), and its KV-event stream state.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use xxhash_rust::xxh3::xxh3_64;

use super::demand::RecentRequests;
use super::endpoint_set::EndpointId;
use super::events::EventState;
use super::load::{EngineLoad, Load};
use super::load_order::LoadOrder;
use super::penalty::Penalty;
use super::prefill_progress::{now_us, PrefillClock};

/// An endpoint's name as the engine address and data-parallel rank it stands for: `"{address}#{rank}"` is
/// one rank of an engine with DP size > 1; any other name (no `#`, or a suffix that is not a number) is
/// the address of a whole engine.
pub fn split_name(name: &str) -> (&str, Option<u32>) {
    match name.rsplit_once('#') {
        Some((address, rank)) if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) => match rank.parse() {
            Ok(rank) => (address, Some(rank)),
            Err(_) => (name, None),
        },
        _ => (name, None),
    }
}

/// The endpoint name of rank `rank` of the engine at `address`.
pub fn rank_name(address: &str, rank: u32) -> String {
    format!("{address}#{rank}")
}

/// The endpoint names of an engine of `dp_size` ranks: its address alone when it has one (or 0), else
/// one `"{address}#{rank}"` per rank.
pub fn engine_endpoint_names(address: &str, dp_size: u32) -> Vec<String> {
    if dp_size <= 1 {
        vec![address.to_string()]
    } else {
        (0..dp_size).map(|r| rank_name(address, r)).collect()
    }
}

pub struct EndpointState {
    /// The endpoint's name: the engine address, or `"{address}#{rank}"` for one data-parallel rank.
    pub address: Arc<str>,
    /// The engine address the name stands for (the name itself without a rank).
    pub engine: Arc<str>,
    /// The data-parallel rank; `None` for an engine routed as a whole.
    pub rank: Option<u32>,
    pub id: EndpointId,
    /// Hash of the address: the endpoint's point for consistent hashing.
    pub address_hash: u64,
    block_size: AtomicU32,
    healthy: AtomicBool,
    in_flight_requests: AtomicU32,
    in_flight_tokens: AtomicU64,
    in_flight_prefill: AtomicU64,
    in_flight_prefilling: AtomicU32,
    running: AtomicU32,
    waiting: AtomicU32,
    max_running: AtomicU32,
    waiting_uncached: AtomicU32,
    kv_usage_bits: AtomicU64,
    /// Its recent failures as streams reported them (`penalty.rs`).
    pub penalty: Penalty,
    events: Mutex<EventState>,
    /// The router's load order, told of every change of the endpoint's load, health or block size.
    order: Option<Arc<LoadOrder>>,
    /// The router dropped the endpoint (`LoadOrder::remove`).
    removed: AtomicBool,
    /// The router has sent it a prompt of at least one full block (`fresh_cache_weight`: an engine
    /// whose events show nothing, and that has published none, is fresh only until then).
    routed_once: AtomicBool,
    /// Its events show no cached block (true until its first batch), and whether it publishes events:
    /// copies of its `EventState`'s, so that a pick and the load order read them without its lock.
    events_empty: AtomicBool,
    publishing: AtomicBool,
    /// Requests sent to it lately (`underused_share`); counted only when that setting is on.
    pub recent: RecentRequests,
    /// When its current prefill began and its measured prefill speed (`prefill_progress`); kept only
    /// when `clocked` (the setting is on): otherwise a request reads no clock.
    pub prefill_clock: PrefillClock,
    clocked: bool,
}

impl EndpointState {
    pub fn new(address: &str, id: EndpointId, block_size: u32, max_engine_blocks: usize) -> Self {
        let (engine, rank) = split_name(address);
        EndpointState {
            address: Arc::from(address),
            engine: Arc::from(engine),
            rank,
            id,
            address_hash: xxh3_64(address.as_bytes()),
            block_size: AtomicU32::new(block_size),
            healthy: AtomicBool::new(true),
            in_flight_requests: AtomicU32::new(0),
            in_flight_tokens: AtomicU64::new(0),
            in_flight_prefill: AtomicU64::new(0),
            in_flight_prefilling: AtomicU32::new(0),
            running: AtomicU32::new(0),
            waiting: AtomicU32::new(0),
            max_running: AtomicU32::new(0),
            waiting_uncached: AtomicU32::new(0),
            kv_usage_bits: AtomicU64::new(0f64.to_bits()),
            penalty: Penalty::default(),
            events: Mutex::new(EventState::new(max_engine_blocks)),
            order: None,
            removed: AtomicBool::new(false),
            routed_once: AtomicBool::new(false),
            events_empty: AtomicBool::new(true),
            publishing: AtomicBool::new(false),
            recent: RecentRequests::default(),
            prefill_clock: PrefillClock::default(),
            clocked: false,
        }
    }

    /// The endpoint keeps its prefill clock (`prefill_progress`).
    pub fn with_prefill_clock(mut self) -> Self {
        self.clocked = true;
        self
    }

    /// The endpoint, keeping `order` up to date.
    pub fn with_order(mut self, order: Arc<LoadOrder>) -> Self {
        self.order = Some(order);
        self
    }

    fn changed(&self) {
        if let Some(order) = &self.order {
            order.update(self);
        }
    }

    /// Its load order's keys count prefilling requests (`LoadOrder::counts_prefilling`).
    fn order_counts_prefilling(&self) -> bool {
        self.order.as_ref().is_some_and(|o| o.counts_prefilling())
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Only `LoadOrder::remove` calls this (under its lock).
    pub(super) fn mark_removed(&self) {
        self.removed.store(true, Ordering::Relaxed);
    }

    pub fn block_size(&self) -> u32 {
        self.block_size.load(Ordering::Relaxed)
    }

    pub fn set_block_size(&self, b: u32) {
        self.block_size.store(b, Ordering::Relaxed);
        self.changed();
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether it was healthy before.
    pub fn set_healthy(&self, h: bool) -> bool {
        let was = self.healthy.swap(h, Ordering::Relaxed);
        self.changed();
        was
    }

    pub fn set_engine_load(&self, l: &EngineLoad) {
        self.running.store(l.running, Ordering::Relaxed);
        self.waiting.store(l.waiting, Ordering::Relaxed);
        self.max_running.store(l.max_running, Ordering::Relaxed);
        self.waiting_uncached
            .store(l.waiting_uncached_tokens, Ordering::Relaxed);
        self.kv_usage_bits
            .store(l.kv_usage.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
        self.changed();
    }

    pub fn load(&self) -> Load {
        Load {
            in_flight_requests: self.in_flight_requests.load(Ordering::Relaxed),
            in_flight_tokens: self.in_flight_tokens.load(Ordering::Relaxed),
            prefill_tokens: self.in_flight_prefill.load(Ordering::Relaxed),
            prefilling_requests: self.in_flight_prefilling.load(Ordering::Relaxed),
            engine: EngineLoad {
                running: self.running.load(Ordering::Relaxed),
                waiting: self.waiting.load(Ordering::Relaxed),
                kv_usage: f64::from_bits(self.kv_usage_bits.load(Ordering::Relaxed)),
                max_running: self.max_running.load(Ordering::Relaxed),
                waiting_uncached_tokens: self.waiting_uncached.load(Ordering::Relaxed),
            },
        }
    }

    /// Whether a prompt of a full block or more was ever routed to it.
    pub fn routed_once(&self) -> bool {
        self.routed_once.load(Ordering::Relaxed)
    }

    pub fn mark_routed(&self) {
        if !self.routed_once() {
            self.routed_once.store(true, Ordering::Relaxed);
            self.changed();
        }
    }

    /// A prompt of `prompt_tokens` was sent to it (a pick's primary, or a fallback that answered). A
    /// prompt shorter than a block caches no full block, and the engine publishes no Stored event for
    /// it: a readiness probe or a one-word question leaves a fresh engine fresh.
    pub fn sent_prompt(&self, prompt_tokens: u64) {
        if prompt_tokens >= u64::from(self.block_size()) {
            self.mark_routed();
        }
    }

    /// Nothing is cached on it as far as the router knows (`fresh_cache_weight`): its events show no
    /// block, or, while it has published none, no request was ever routed to it.
    pub fn nothing_cached(&self) -> bool {
        self.events_empty.load(Ordering::Relaxed) && (self.publishing.load(Ordering::Relaxed) || !self.routed_once())
    }

    /// Fresh: nothing cached and nothing on it, as of `load`.
    pub fn fresh(&self, load: &Load) -> bool {
        load.requests() == 0 && self.nothing_cached()
    }

    /// Copies what `events` show (after a batch or a reset), telling the load order when it changes.
    pub fn events_changed(&self, events: &EventState) {
        let empty = events.engine_map().is_empty();
        let was_empty = self.events_empty.swap(empty, Ordering::Relaxed);
        let was_publishing = self.publishing.swap(events.publishing, Ordering::Relaxed);
        if was_empty != empty || was_publishing != events.publishing {
            self.changed();
        }
    }

    // A poisoned lock means a panic mid-batch; the next gap or reset resynchronizes the state.
    pub fn events(&self) -> MutexGuard<'_, EventState> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request in flight on an endpoint: counted from creation until drop, whatever path the request
/// takes (completion, error, client disconnect, panic), so the accounting cannot leak. It counts as
/// prefilling, with its expected prefill work, until the first token (`first_token`) or the drop,
/// whichever comes first.
#[must_use = "the request counts as in flight only while this guard lives"]
pub struct InFlight {
    endpoint: Arc<EndpointState>,
    tokens: u64,
    prefill: u64,
    prefilling: bool,
    /// `now_us` at the pick (0 when the endpoint keeps no clock): the request's first token times the
    /// endpoint's prefill speed.
    began_us: u64,
    /// The request is the probe of a half-open endpoint: the slot frees when it ends.
    probe: Option<u64>,
}

impl InFlight {
    /// `tokens`: the prompt's length; `prefill`: the part of it the endpoint is expected to compute.
    pub fn begin(endpoint: Arc<EndpointState>, tokens: u64, prefill: u64) -> Self {
        endpoint.in_flight_requests.fetch_add(1, Ordering::Relaxed);
        endpoint.in_flight_tokens.fetch_add(tokens, Ordering::Relaxed);
        endpoint.in_flight_prefill.fetch_add(prefill, Ordering::Relaxed);
        let began_us = if endpoint.clocked { now_us() } else { 0 };
        if endpoint.in_flight_prefilling.fetch_add(1, Ordering::Relaxed) == 0 && endpoint.clocked {
            endpoint.prefill_clock.restart(began_us);
        }
        endpoint.changed();
        InFlight {
            endpoint,
            tokens,
            prefill,
            prefilling: true,
            began_us,
            probe: None,
        }
    }

    /// The request probes its half-open endpoint (`Penalty::picked`).
    pub fn with_probe(mut self, probe: Option<u64>) -> Self {
        self.probe = probe;
        self
    }

    pub fn address(&self) -> &str {
        &self.endpoint.address
    }

    /// The engine sent its first token: the prompt is prefilled. Later calls do nothing.
    pub fn first_token(&mut self) {
        let had_prefill = self.prefill > 0;
        if self.prefilling && self.endpoint.clocked {
            let now = now_us();
            self.endpoint.prefill_clock.sample(self.prefill, self.began_us, now);
            if self.endpoint.in_flight_prefilling.load(Ordering::Relaxed) > 1 {
                self.endpoint.prefill_clock.restart(now); // the next pending prefill runs now
            }
        }
        // The load order ranks by the prefill tokens, and by the prefilling count only when the spill
        // gate counts it: otherwise a cached request's first token changes nothing it ranks by.
        if self.take_prefill() && (had_prefill || self.endpoint.order_counts_prefilling()) {
            self.endpoint.changed();
        }
    }

    /// Stops counting the request as prefilling; whether it still was.
    fn take_prefill(&mut self) -> bool {
        if !std::mem::take(&mut self.prefilling) {
            return false;
        }
        let prefill = std::mem::take(&mut self.prefill);
        self.endpoint.in_flight_prefill.fetch_sub(prefill, Ordering::Relaxed);
        self.endpoint.in_flight_prefilling.fetch_sub(1, Ordering::Relaxed);
        true
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.take_prefill();
        self.endpoint.in_flight_requests.fetch_sub(1, Ordering::Relaxed);
        self.endpoint.in_flight_tokens.fetch_sub(self.tokens, Ordering::Relaxed);
        self.endpoint.changed();
        if let Some(probe) = self.probe {
            self.endpoint.penalty.probe_ended(probe);
        }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("address", &self.endpoint.address)
            .field("tokens", &self.tokens)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_the_engine_address_and_its_rank() {
        assert_eq!(split_name("10.0.0.1:8000"), ("10.0.0.1:8000", None));
        assert_eq!(split_name("10.0.0.1:8000#0"), ("10.0.0.1:8000", Some(0)));
        assert_eq!(split_name("10.0.0.1:8000#12"), ("10.0.0.1:8000", Some(12)));
        assert_eq!(split_name("[::1]:8000#3"), ("[::1]:8000", Some(3)));
        // Only a numeric suffix after the last '#' is a rank.
        for whole in ["a:1#", "a:1#x", "a:1#+1", "a:1#-1", "a:1# 1", "a:1#99999999999"] {
            assert_eq!(split_name(whole), (whole, None), "{whole}");
        }
        assert_eq!(split_name("a#b:1#2"), ("a#b:1", Some(2)));
        assert_eq!(split_name(&rank_name("h:9", 5)), ("h:9", Some(5)));
    }

    #[test]
    fn an_engine_has_one_endpoint_per_rank_or_its_address() {
        assert_eq!(engine_endpoint_names("h:9", 0), ["h:9"]);
        assert_eq!(engine_endpoint_names("h:9", 1), ["h:9"]);
        assert_eq!(engine_endpoint_names("h:9", 3), ["h:9#0", "h:9#1", "h:9#2"]);
        let st = EndpointState::new("h:9#2", 0, 16, 8);
        assert_eq!((&*st.address, &*st.engine, st.rank), ("h:9#2", "h:9", Some(2)));
    }

    #[test]
    fn a_request_prefills_until_its_first_token_or_its_end() {
        let st = Arc::new(EndpointState::new("h:9", 0, 16, 8));
        let counts = |st: &EndpointState| {
            let l = st.load();
            (l.in_flight_requests, l.prefilling_requests, l.prefill_tokens)
        };
        let mut cached = InFlight::begin(st.clone(), 64, 0);
        let mut uncached = InFlight::begin(st.clone(), 64, 48);
        let ends_early = InFlight::begin(st.clone(), 32, 32);
        assert_eq!(counts(&st), (3, 3, 80));
        // A fully cached prompt is still prefilling until its first token.
        cached.first_token();
        assert_eq!(counts(&st), (3, 2, 80));
        uncached.first_token();
        uncached.first_token();
        assert_eq!(counts(&st), (3, 1, 32));
        drop(ends_early);
        assert_eq!(counts(&st), (2, 0, 0));
        drop((cached, uncached));
        assert_eq!(counts(&st), (0, 0, 0));
    }
}
