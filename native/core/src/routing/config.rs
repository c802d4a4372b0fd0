//! Router settings, one set per served model, with defaults for every field; `from_json` reads the
//! shape the Python settings pass through (unknown keys are an error, not silently ignored).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::RoutingError;

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Blocks each prefix index (precise, approximate) keeps before evicting.
    pub max_blocks: usize,
    /// Engine-hash mappings kept per endpoint (bounds a publisher that never removes).
    pub max_engine_blocks: usize,
    /// Approximate mode: how long a routed prompt's blocks count as cached on the chosen endpoint.
    pub routed_ttl_s: f64,
    /// Precise mode (`kv_events`): how long a just-routed prompt's blocks count as held by the chosen
    /// endpoint before its KV events confirm them (optimistic booking); 0 turns booking off.
    pub book_routed_s: f64,
    /// Precise mode: the same booking for a cold prompt only, one whose first block no engine's events
    /// show anywhere (a new shared prefix, or every prompt of a cold start), for this many seconds; 0 is
    /// off. Its engine prefills it while a burst of the same prefix arrives; without the booking each of
    /// those looks cold too and is spread, prefilling the prefix again elsewhere (`policy/affinity.rs`).
    /// On by default (2 s, over half the pool and at least two engines): without it, a few hot
    /// system prompts arriving at full rate on fresh engines were prefilled on every engine and the
    /// backlog ran for seconds (docs/routing-benchmark.md, sessions 32-33).
    pub book_cold_s: f64,
    /// Cold booking: how many engines a burst of one cold prefix is spread over before its bookings
    /// count. 1 keeps the burst on the first engine; 2 lets the second request of the burst go where
    /// the load says (a second engine prefills the prefix too) and the rest follow the two bookings.
    /// 2 by default: a new hot prompt kept on one engine of two cost 4-7% of mean TTFT at 50% load.
    pub book_cold_spread: u32,
    /// Cold booking: the same spread as a share of the healthy endpoints: the bookings count once
    /// `ceil(share x healthy)` engines hold one, or `book_cold_spread` if more; 0 is off. A fixed
    /// number of engines per new prefix is too few in a large pool (docs/routing.md, cold booking).
    /// 0.5 by default: one engine per new prefix left a hot system prompt's pool lopsided afterwards.
    pub book_cold_spread_share: f64,
    /// Precise mode: a request with a session key (`x-session-id` or `user`) books its prompt on its
    /// primary for this many seconds, for its own session only; 0 is off. A later request of that
    /// session starting with the prompt counts it as held there before the engine's events show it,
    /// so a turn sent while the previous one is still prefilling follows it (`session_bookings.rs`).
    /// On by default (5 s): without it, session traffic whose turns overlap collapsed after an
    /// overload or an engine restart (docs/routing-benchmark.md, session 22).
    pub book_session_s: f64,
    /// Fallback endpoints listed after the primary.
    pub max_fallbacks: usize,
    /// Seed of the policies' random draws; from the clock when unset.
    pub seed: Option<u64>,
    /// Spill gate (affinity and weighted policies): an endpoint is skipped while its requests exceed
    /// both `min + spill_abs` and `min * spill_ratio`, `min` being the least loaded candidate's.
    pub spill_enabled: bool,
    pub spill_abs: u32,
    pub spill_ratio: f64,
    /// What the spill gate counts as an endpoint's requests: only those still waiting for their first
    /// token (`prefilling`, the default; `Load::awaiting_first_token`) or every request on it
    /// (`requests`). A request past its first token only decodes: it delays a new prompt's first token
    /// by its share of a step, not by a prefill, and counting it moved hits off a hot prefix's holder
    /// (docs/routing-benchmark.md, session 30).
    pub spill_counts: SpillCounts,
    /// Affinity policies: what one request already on an endpoint adds to its expected wait, in
    /// prefill tokens (see `policy/affinity.rs`).
    pub request_cost_tokens: u32,
    /// Affinity policies: the weight of a request's own uncached prompt tokens in its expected wait
    /// (see `policy/affinity.rs`): 3 by default (the request's own prefill, and the work it adds to the
    /// engine for everything after it and to the cache it evicts from); 1 counts them once.
    pub uncached_weight: f64,
    /// Affinity policies: the holder band, in prefill tokens. An endpoint holding the longest cached
    /// prefix of the request, when that prefix is at least half the prompt (a session's history, a long
    /// shared prompt), stays first unless its expected wait exceeds the best by more than this (see
    /// `policy/affinity.rs`); 0 (the default) leaves the ranking to the expected wait alone.
    pub holder_slack_tokens: u32,
    /// Affinity policies: for a session's first request (or one without a session key), what each
    /// session resident on an endpoint adds to its expected wait, in prefill tokens; 0 (the default) is
    /// off. A session resides where its last request went once it has sent two, until
    /// `resident_window_s` after its last (`residents.rs`): between turns it has nothing in flight, but
    /// its next turn will prefill there. Needs session keys (`x-session-id` or `user`).
    pub resident_session_tokens: u32,
    /// How long a session is remembered after its last request, in seconds.
    pub resident_window_s: f64,
    /// Affinity policies with KV events: the weight of a request's uncached tokens on a fresh endpoint
    /// (its events show no cached block and nothing is on it: a new or restarted engine) instead of
    /// `uncached_weight`; 0.25 by default, unset (`null`) is off. A miss there evicts nothing and delays
    /// nobody, so only its own prefill counts; a hot shared prefix is copied to an idle new engine
    /// rather than queued on its busy holders (`policy/affinity.rs`).
    pub fresh_cache_weight: Option<f64>,
    /// Affinity policies: an endpoint whose recent requests (`demand_window_s`) are below this share of
    /// the healthy endpoints' mean is underused, and a new request (no live session booking: a session's first
    /// turn, or one without a session key) prices its uncached tokens there at 0; 0 (the default) is
    /// off. A lasting imbalance means the prefixes the busy engines hold draw more traffic than they
    /// serve well, and a copy on the underused engine is worth its prefill: a few hot system prompts
    /// started on fewer engines than the pool has (cold booking) stay there otherwise, because at light
    /// load no holder's queue outweighs a long prompt's prefill (`policy/affinity.rs`, point 6).
    pub underused_share: f64,
    /// Affinity policies: on an endpoint that holds none of the prompt and was sent more requests lately
    /// (`demand_window_s`) than the healthy endpoints' mean, the request's uncached tokens weigh
    /// `busy_miss_weight` x (its recent requests / the mean - 1) more; 0 (the default) is off. A miss
    /// prefilled there delays the hits its prefixes keep drawing, which the expected wait (what is on
    /// the engine now) does not see (`policy/affinity.rs`, point 7).
    pub busy_miss_weight: f64,
    /// Affinity policies: an endpoint holding part of the prompt has its own prefill backlog read less
    /// what it has done of it since its current prefill began, at its measured prefill speed
    /// (`prefill_progress.rs`); off (false) by default. Without it a prefill under way counts whole
    /// until its first token, and a request whose prefix that endpoint holds goes elsewhere to
    /// prefill it again for about the same first-token time.
    pub prefill_progress: bool,
    /// The window of `underused_share`'s and `busy_miss_weight`'s recent requests, in seconds: each
    /// request's weight decays by `exp(-age / window)`.
    pub demand_window_s: f64,
    /// Load shedding: when every candidate has at least this many queued requests (`Load::queue`), a
    /// sheddable request (negative priority) is refused (HTTP 429) instead of queued deeper; 0 never sheds.
    pub shed_queue_depth: u32,
    /// Request priorities (the Gateway API Inference Extension's InferenceObjectives): objective name, as
    /// the `x-gateway-inference-objective` header gives it → priority. Higher is more important; a
    /// negative priority makes the request sheddable.
    pub objectives: BTreeMap<String, i32>,
    /// The priority of a request naming no objective, or one not in `objectives`.
    pub default_priority: i32,
    /// Weighted policy: scorer type name → weight.
    pub scorers: BTreeMap<String, f64>,
    /// Weighted policy: which index the `prefix` scorer reads, "events" (precise) or "routed".
    pub prefix_source: String,
}

/// What the spill gate counts (`RouterConfig::spill_counts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpillCounts {
    Requests,
    #[default]
    Prefilling,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            max_blocks: 1 << 18,
            max_engine_blocks: 1 << 20,
            routed_ttl_s: 120.0,
            book_routed_s: 0.0,
            book_cold_s: 2.0,
            book_cold_spread: 2,
            book_cold_spread_share: 0.5,
            book_session_s: 5.0,
            max_fallbacks: 3,
            seed: None,
            spill_enabled: true,
            spill_abs: 8,
            spill_ratio: 1.5,
            spill_counts: SpillCounts::default(),
            request_cost_tokens: 16,
            uncached_weight: 3.0,
            holder_slack_tokens: 0,
            resident_session_tokens: 0,
            resident_window_s: 5.0,
            fresh_cache_weight: Some(0.25),
            underused_share: 0.0,
            busy_miss_weight: 0.0,
            prefill_progress: false,
            demand_window_s: 5.0,
            shed_queue_depth: 0,
            objectives: BTreeMap::new(),
            default_priority: 0,
            scorers: [("prefix", 3.0), ("queue", 2.0), ("load", 1.0), ("kv_usage", 1.0)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            prefix_source: "events".to_string(),
        }
    }
}

impl RouterConfig {
    pub fn from_json(json: &str) -> Result<Self, RoutingError> {
        let cfg: RouterConfig = serde_json::from_str(json).map_err(|e| RoutingError::BadConfig(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The priority of a request of `objective` (its `x-gateway-inference-objective` header).
    pub fn priority(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|name| self.objectives.get(name))
            .copied()
            .unwrap_or(self.default_priority)
    }

    pub fn validate(&self) -> Result<(), RoutingError> {
        let bad = |m: &str| Err(RoutingError::BadConfig(m.to_string()));
        if self.max_blocks == 0 {
            return bad("max_blocks must be positive");
        }
        if !(self.routed_ttl_s > 0.0 && self.routed_ttl_s.is_finite()) {
            return bad("routed_ttl_s must be positive");
        }
        if !(self.uncached_weight >= 1.0 && self.uncached_weight.is_finite()) {
            return bad("uncached_weight must be at least 1");
        }
        if !(self.book_routed_s >= 0.0 && self.book_routed_s.is_finite()) {
            return bad("book_routed_s must be zero or positive");
        }
        if !(self.book_cold_s >= 0.0 && self.book_cold_s.is_finite()) {
            return bad("book_cold_s must be zero or positive");
        }
        if !(self.book_session_s >= 0.0 && self.book_session_s.is_finite()) {
            return bad("book_session_s must be zero or positive");
        }
        if !(self.resident_window_s > 0.0 && self.resident_window_s.is_finite()) {
            return bad("resident_window_s must be positive");
        }
        if self.fresh_cache_weight.is_some_and(|w| !(w >= 0.0 && w.is_finite())) {
            return bad("fresh_cache_weight must be zero or positive");
        }
        if !(0.0..=1.0).contains(&self.underused_share) {
            return bad("underused_share must be between 0 and 1");
        }
        if !(self.busy_miss_weight >= 0.0 && self.busy_miss_weight.is_finite()) {
            return bad("busy_miss_weight must be zero or positive");
        }
        if !(self.demand_window_s > 0.0 && self.demand_window_s.is_finite()) {
            return bad("demand_window_s must be positive");
        }
        if self.book_cold_spread == 0 {
            return bad("book_cold_spread must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.book_cold_spread_share) {
            return bad("book_cold_spread_share must be between 0 and 1");
        }
        if !(self.spill_ratio >= 1.0 && self.spill_ratio.is_finite()) {
            return bad("spill_ratio must be at least 1");
        }
        if self.scorers.values().any(|w| !(w.is_finite() && *w >= 0.0)) {
            return bad("scorer weights must be finite and non-negative");
        }
        if !matches!(self.prefix_source.as_str(), "events" | "routed") {
            return bad("prefix_source must be \"events\" or \"routed\"");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_json_keeps_defaults_and_rejects_unknown_keys() {
        let c = RouterConfig::from_json(r#"{"spill_abs": 2, "scorers": {"prefix": 1}}"#).unwrap();
        assert_eq!(c.spill_abs, 2);
        assert_eq!(c.scorers.len(), 1);
        assert_eq!(c.max_fallbacks, RouterConfig::default().max_fallbacks);
        assert!(matches!(
            RouterConfig::from_json(r#"{"spil_abs": 2}"#),
            Err(RoutingError::BadConfig(_))
        ));
        assert!(RouterConfig::from_json(r#"{"spill_ratio": 0.5}"#).is_err());
        assert!(RouterConfig::from_json(r#"{"prefix_source": "guess"}"#).is_err());
        assert_eq!(RouterConfig::default().holder_slack_tokens, 0);
        let c = RouterConfig::from_json(r#"{"holder_slack_tokens": 256}"#).unwrap();
        assert_eq!(c.holder_slack_tokens, 256);
        assert!(RouterConfig::from_json(r#"{"holder_slack_tokens": -1}"#).is_err());
    }

    #[test]
    fn objectives_map_names_to_priorities_and_the_rest_get_the_default() {
        let c = RouterConfig::default();
        assert!(c.objectives.is_empty());
        assert_eq!(
            (c.default_priority, c.priority(None), c.priority(Some("batch"))),
            (0, 0, 0)
        );
        let json = r#"{"shed_queue_depth": 4, "objectives": {"batch": -1, "chat": 10}, "default_priority": -2}"#;
        let c = RouterConfig::from_json(json).unwrap();
        assert_eq!(c.objectives.len(), 2);
        assert_eq!(c.priority(Some("batch")), -1);
        assert_eq!(c.priority(Some("chat")), 10);
        assert_eq!(c.priority(Some("unknown")), -2);
        assert_eq!(c.priority(None), -2);
        // Unknown keys are still refused, and priorities are integers.
        assert!(RouterConfig::from_json(r#"{"objective": {"batch": -1}}"#).is_err());
        assert!(RouterConfig::from_json(r#"{"objectives": {"batch": "low"}}"#).is_err());
        assert!(RouterConfig::from_json(r#"{"default_priority": 0.5}"#).is_err());
    }
}
