//! One scrape: the registry's counters and histograms, then gauges read from the gateway's state as it
//! is now (each model's router endpoints, prefix indexes and tokenizer cache). Also the operator's
//! engine view (`engines`), from the same state.

use std::sync::atomic::Ordering;

use super::text::Exposition;
use super::{global, Metrics, Phase, NANOS};
use crate::gateway::Gateway;
use crate::routing::{EndpointInfo, Standing};

/// One engine endpoint of one model, as an operator sees it (`GET /engines`, `extproc status`).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineView {
    pub model: String,
    /// The endpoint's name: the engine's address, or `"{address}#{rank}"` for one data-parallel rank.
    pub engine: String,
    pub protocol: &'static str,
    pub healthy: bool,
    pub in_flight_requests: u32,
    pub in_flight_tokens: u64,
    /// The engine's own report (GetLoads or its KV events): running and waiting requests, KV-cache use.
    pub running: u32,
    pub waiting: u32,
    pub kv_usage: f64,
    /// Engine blocks the router mapped from the endpoint's KV events.
    pub cached_blocks: usize,
    /// The router believes the engine holds nothing cached: no event shows a block and, for an engine
    /// without events, no prompt of a block or more was sent to it (a new, restarted or cleared engine).
    pub nothing_cached: bool,
    /// Consecutive failures (0: none) and where the router's penalty stands (`closed`, `half_open`,
    /// `ejected`).
    pub penalty_failures: u32,
    pub penalty: &'static str,
}

fn standing_name(s: Standing) -> &'static str {
    match s {
        Standing::Closed => "closed",
        Standing::HalfOpen { .. } => "half_open",
        Standing::Ejected => "ejected",
    }
}

/// `standing_name` as a gauge value: 0 closed, 1 half open, 2 ejected.
fn standing_value(s: Standing) -> f64 {
    match s {
        Standing::Closed => 0.0,
        Standing::HalfOpen { .. } => 1.0,
        Standing::Ejected => 2.0,
    }
}

/// Every model's endpoints, by model (configuration order) then endpoint name.
pub fn engines(gateway: &Gateway) -> Vec<EngineView> {
    let mut out = Vec::new();
    for model in gateway.models() {
        let mut endpoints = model.router.endpoints();
        endpoints.sort_by(|a, b| a.address.cmp(&b.address));
        for e in endpoints {
            out.push(EngineView {
                model: model.name.clone(),
                engine: e.address.to_string(),
                protocol: model.protocol(&e.address).as_str(),
                healthy: e.healthy,
                in_flight_requests: e.load.in_flight_requests,
                in_flight_tokens: e.load.in_flight_tokens,
                running: e.load.engine.running,
                waiting: e.load.engine.waiting,
                kv_usage: e.load.engine.kv_usage,
                cached_blocks: e.engine_blocks,
                nothing_cached: e.nothing_cached,
                penalty_failures: e.failures,
                penalty: standing_name(e.standing),
            });
        }
    }
    out
}

/// The whole `/metrics` text of the data plane.
pub fn render(gateway: &Gateway) -> String {
    let mut e = Exposition::default();
    counters(&mut e, global());
    gauges(&mut e, gateway);
    e.finish()
}

pub(super) fn counters(e: &mut Exposition, m: &Metrics) {
    e.counters(
        "extproc_requests_total",
        "Requests the gateway finished, by model, API path, client status (0: ended before any answer) and engine.",
        &m.requests,
    );
    let tokens = m.tokens.series();
    for (name, help, pick) in [
        ("extproc_prompt_tokens_total", "Prompt tokens of finished requests.", 0),
        (
            "extproc_cached_tokens_total",
            "Prompt tokens the engines served from their prefix cache.",
            1,
        ),
        (
            "extproc_completion_tokens_total",
            "Completion tokens of finished requests.",
            2,
        ),
    ] {
        e.header(name, "counter", help);
        for s in &tokens {
            let t = &s.value;
            let v = [&t.prompt, &t.cached, &t.completion][pick].load(Ordering::Relaxed);
            e.sample(name, &[("model", &s.labels[0])], v as f64);
        }
    }
    e.histograms(
        "gen_ai_client_token_usage",
        "Number of input and output tokens used (successful generation requests).",
        &m.token_usage,
        1.0,
    );
    e.histograms(
        "gen_ai_server_request_duration_seconds",
        "Generative AI server request duration, from the request's first byte to its last.",
        &m.request_duration,
        NANOS,
    );
    e.histograms(
        "gen_ai_server_time_to_first_token_seconds",
        "Time to generate first token for successful streamed responses.",
        &m.time_to_first_token,
        NANOS,
    );
    e.histograms(
        "gen_ai_server_time_per_output_token_seconds",
        "Time per output token generated after the first token for successful streamed responses.",
        &m.time_per_output_token,
        NANOS,
    );
    let name = "extproc_phase_duration_seconds";
    e.header(
        name,
        "histogram",
        "Gateway processing time per phase: parse, template, tokenize, route, encode, and decode per response chunk.",
    );
    for (phase, h) in Phase::ALL.iter().zip(&m.phases) {
        e.histogram(name, &[("phase", phase.name())], h, NANOS);
    }
    e.counters(
        "extproc_routing_decisions_total",
        "Routing decisions by model, policy and reason (hit, miss, spill, fallback, shed, no_endpoint).",
        &m.routing,
    );
    e.counters(
        "extproc_kv_event_batches_total",
        "KV-event batches received per engine endpoint, by outcome (applied, gap, duplicate, malformed...).",
        &m.kv_batches,
    );
    e.counters(
        "extproc_kv_event_resyncs_total",
        "KV-event subscriptions reset per engine (after a gap, a malformed batch or a reconnect).",
        &m.kv_resyncs,
    );
    let name = "extproc_kv_event_lag_seconds";
    e.header(
        name,
        "gauge",
        "Age of the last KV-event batch when it arrived (engine timestamp to now).",
    );
    for s in m.kv_lag.series() {
        let lag = f64::from_bits(s.value.load(Ordering::Relaxed));
        e.sample(name, &[("engine", &s.labels[0])], lag);
    }
}

type EndpointGauge = (&'static str, &'static str, fn(&EndpointInfo) -> f64);

const ENDPOINT_GAUGES: [EndpointGauge; 10] = [
    (
        "extproc_engine_healthy",
        "1 while the engine passes its health checks.",
        |e| f64::from(u8::from(e.healthy)),
    ),
    (
        "extproc_engine_in_flight_requests",
        "Requests this gateway sent to the engine that have not finished.",
        |e| f64::from(e.load.in_flight_requests),
    ),
    (
        "extproc_engine_in_flight_tokens",
        "Prompt tokens of the in-flight requests.",
        |e| e.load.in_flight_tokens as f64,
    ),
    (
        "extproc_engine_prefill_tokens",
        "Uncached prompt tokens of in-flight requests still waiting for their first token.",
        |e| e.load.prefill_tokens as f64,
    ),
    (
        "extproc_engine_running_requests",
        "Running requests, as the engine last reported.",
        |e| f64::from(e.load.engine.running),
    ),
    (
        "extproc_engine_waiting_requests",
        "Waiting requests, as the engine last reported.",
        |e| f64::from(e.load.engine.waiting),
    ),
    (
        "extproc_engine_kv_cache_usage_ratio",
        "KV-cache use in [0, 1], as the engine last reported.",
        |e| e.load.engine.kv_usage,
    ),
    (
        "extproc_engine_cached_blocks",
        "Engine KV blocks the router mapped from the engine's KV events.",
        |e| e.engine_blocks as f64,
    ),
    (
        "extproc_engine_nothing_cached",
        "1 while the router believes the engine caches nothing (new, restarted or cleared): idle, it is priced as fresh.",
        |e| f64::from(u8::from(e.nothing_cached)),
    ),
    (
        "extproc_engine_penalty_state",
        "The router's penalty for the engine: 0 closed, 1 half open (probing), 2 ejected.",
        |e| standing_value(e.standing),
    ),
];

fn gauges(e: &mut Exposition, gateway: &Gateway) {
    let models = gateway.models();
    let endpoints: Vec<(String, Vec<EndpointInfo>)> =
        models.iter().map(|m| (m.name.clone(), m.router.endpoints())).collect();
    for (name, help, value) in ENDPOINT_GAUGES {
        e.header(name, "gauge", help);
        for (model, list) in &endpoints {
            for info in list {
                e.sample(name, &[("model", model), ("engine", &info.address)], value(info));
            }
        }
    }
    let name = "extproc_engine_penalty_failures";
    e.header(
        name,
        "gauge",
        "Consecutive failed calls the router's penalty counts for the engine.",
    );
    for (model, list) in &endpoints {
        for info in list {
            e.sample(
                name,
                &[("model", model), ("engine", &info.address)],
                f64::from(info.failures),
            );
        }
    }
    let stats: Vec<_> = models.iter().map(|m| (&m.name, m.router.index_stats())).collect();
    let name = "extproc_prefix_index_blocks";
    e.header(
        name,
        "gauge",
        "Blocks in the router's prefix indexes, by index (events, routed).",
    );
    for (model, s) in &stats {
        e.sample(name, &[("model", model), ("index", "events")], s.event_blocks as f64);
        e.sample(name, &[("model", model), ("index", "routed")], s.routed_blocks as f64);
    }
    let name = "extproc_prefix_index_memory_bytes";
    e.header(
        name,
        "gauge",
        "Memory of the router's prefix indexes and engine-hash maps.",
    );
    for (model, s) in &stats {
        e.sample(name, &[("model", model)], s.memory_bytes as f64);
    }
    let name = "extproc_tokenizer_cache_lookups_total";
    e.header(
        name,
        "counter",
        "Token-cache lookups by level (l0: exact prompt, l1: cached prefix) and result (hit, miss).",
    );
    for m in &models {
        let c = m.files.tokenizer.cache_stats();
        for (level, result, v) in [
            ("l0", "hit", c.l0_hits),
            ("l0", "miss", c.l0_misses),
            ("l1", "hit", c.l1_hits),
            ("l1", "miss", c.l1_misses),
        ] {
            e.sample(
                name,
                &[("model", &m.name), ("level", level), ("result", result)],
                v as f64,
            );
        }
    }
}
