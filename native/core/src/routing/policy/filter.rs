//! Filters that run before scoring. Health and Envoy's subset hint are applied by the router when it
//! builds the candidates; here is the spill gate.
//!
//! Spill gate: with `r_e` an endpoint's requests without a first token (`Load::awaiting_first_token`;
//! with `spill_counts = "requests"` every request, `Load::requests`) and `m = min_e r_e`, the endpoint
//! is skipped when `r_e > m + abs` and `r_e > m * ratio`. Cache affinity then never piles more than a
//! bounded excess of queued prefills on the endpoint holding a popular prefix; skipped endpoints stay
//! usable as the last fallbacks. Decoding requests are left to the expected wait's request cost:
//! counted here, a holder decoding `abs` more answers than an idle engine sent a hot prefix's hits
//! there to be prefilled whole (docs/routing-benchmark.md, session 30).

use super::Candidate;
use crate::routing::config::{RouterConfig, SpillCounts};
use crate::routing::load::Load;

/// (requests the gate counts, requests, in-flight tokens): `SpillGate::load_key`.
pub type GateLoadKey = (u32, u32, u64);

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpillGate {
    pub enabled: bool,
    pub abs: u32,
    pub ratio: f64,
    pub counts: SpillCounts,
}

impl SpillGate {
    pub fn from_config(cfg: &RouterConfig) -> Self {
        SpillGate {
            enabled: cfg.spill_enabled,
            abs: cfg.spill_abs,
            ratio: cfg.spill_ratio,
            counts: cfg.spill_counts,
        }
    }

    /// The requests the gate counts on an endpoint with `load`.
    pub fn requests(&self, load: &Load) -> u32 {
        match self.counts {
            SpillCounts::Requests => load.requests(),
            SpillCounts::Prefilling => load.awaiting_first_token(),
        }
    }

    /// The load order of the affinity ranking's ties and spilled endpoints: the requests the gate
    /// counts, then every request, then in-flight tokens. With the gate counting every request it is
    /// the plain load order (`picker::load_key`); the router's load order keeps the same key, so that
    /// its walks find the gate's least loaded and its spilled endpoints in ranking order.
    pub fn load_key(&self, load: &Load) -> GateLoadKey {
        (self.requests(load), load.requests(), load.in_flight_tokens)
    }

    /// Candidate indices split into (kept, spilled); `kept` is never empty.
    pub fn split(&self, candidates: &[Candidate]) -> (Vec<usize>, Vec<usize>) {
        let min = self.min_requests(candidates);
        (0..candidates.len()).partition(|&i| self.keeps(&candidates[i], min))
    }

    /// The fewest requests on any candidate: `keeps`'s `min`.
    pub fn min_requests(&self, candidates: &[Candidate]) -> u32 {
        candidates.iter().map(|c| self.requests(&c.load)).min().unwrap_or(0)
    }

    /// Whether `c` passes the gate when the least loaded candidate has `min` requests.
    pub fn keeps(&self, c: &Candidate, min: u32) -> bool {
        self.keeps_requests(self.requests(&c.load), min)
    }

    /// Whether an endpoint with `r` requests passes the gate when the least loaded has `min`.
    pub fn keeps_requests(&self, r: u32, min: u32) -> bool {
        !self.enabled || r <= min.saturating_add(self.abs) || f64::from(r) <= f64::from(min) * self.ratio
    }

    /// The fewest requests of a spilled endpoint when the least loaded has `min` (`None`: none is): the
    /// gate keeps exactly those with fewer, both of its bounds growing with `r`.
    pub fn first_spilled(&self, min: u32) -> Option<u32> {
        if !self.enabled {
            return None;
        }
        let mut r = min
            .saturating_add(self.abs)
            .max((f64::from(min) * self.ratio).min(f64::from(u32::MAX)) as u32);
        // `keeps_requests` decides; the estimate is off by at most one either way (rounding).
        while r > min && !self.keeps_requests(r, min) {
            r -= 1;
        }
        while self.keeps_requests(r, min) {
            r = r.checked_add(1)?;
        }
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;

    #[test]
    fn skips_only_endpoints_past_both_thresholds() {
        let gate = SpillGate {
            enabled: true,
            abs: 4,
            ratio: 1.5,
            counts: SpillCounts::Requests,
        };
        let c = [cand(0, 10, 0), cand(1, 14, 0), cand(2, 15, 0), cand(3, 16, 0)];
        // min 10: kept while r <= 14 or r <= 15.
        assert_eq!(gate.split(&c), (vec![0, 1, 2], vec![3]));
        let idle = [cand(0, 0, 0), cand(1, 4, 0), cand(2, 5, 0)];
        assert_eq!(gate.split(&idle), (vec![0, 1], vec![2]));
        assert_eq!(SpillGate { enabled: false, ..gate }.split(&idle).1, Vec::<usize>::new());
    }

    #[test]
    fn a_gate_counting_prefilling_requests_ignores_decoding_ones() {
        let requests = SpillGate {
            enabled: true,
            abs: 4,
            ratio: 1.5,
            counts: SpillCounts::Requests,
        };
        let prefilling = SpillGate {
            counts: SpillCounts::Prefilling,
            ..requests
        };
        // Endpoint 0 decodes 12 answers and prefills 1 prompt; endpoint 1 prefills 2 of its 2.
        let mut decoding = cand(0, 13, 0);
        decoding.load.prefilling_requests = 1;
        let mut idle = cand(1, 2, 0);
        idle.load.prefilling_requests = 2;
        let c = [decoding, idle];
        assert_eq!(requests.split(&c), (vec![1], vec![0]));
        assert_eq!(prefilling.split(&c), (vec![0, 1], vec![]));
        // The engine's own queue counts too (other gateways' requests waiting to start).
        let mut queued = decoding;
        queued.load.engine.waiting = 9;
        assert_eq!(prefilling.requests(&queued.load), 9);
        assert_eq!(prefilling.split(&[queued, idle]), (vec![1], vec![0]));
    }

    #[test]
    fn the_first_spilled_load_is_where_the_gate_stops_keeping() {
        for ratio in [1.0, 1.1, 1.5, 2.0, 3.7] {
            for abs in [0, 1, 4, 8] {
                let gate = SpillGate {
                    enabled: true,
                    abs,
                    ratio,
                    counts: SpillCounts::Requests,
                };
                for min in (0..200).chain([u32::MAX - 3, u32::MAX]) {
                    match gate.first_spilled(min) {
                        Some(r) => assert!(
                            !gate.keeps_requests(r, min) && gate.keeps_requests(r - 1, min),
                            "{min} {abs} {ratio}: {r}"
                        ),
                        None => assert!(gate.keeps_requests(u32::MAX, min)),
                    }
                }
            }
        }
        let off = SpillGate {
            enabled: false,
            abs: 0,
            ratio: 1.0,
            counts: SpillCounts::Requests,
        };
        assert_eq!(off.first_spilled(3), None);
    }
}
