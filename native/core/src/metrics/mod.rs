//! The gateway's Prometheus metrics, counted in Rust on the data path.
//!
//! One process-wide registry (`global()`): families of atomic counters and histograms keyed by label
//! values, found under a read lock once their series exists. Requests are counted once, when their
//! ext_proc stream ends (`request_ended`); phases where they happen (`Phase::observe`); routing
//! decisions and KV-event batches where the router makes or applies them. Gauges (in-flight requests,
//! engine load, prefix-index size, tokenizer cache) are not counted at all: `scrape::render` reads them
//! from the gateway's state when scraped. `EXTPROC_METRICS=off` turns all counting off (to measure what
//! it costs); a scrape then shows only the gauges.
//!
//! Names follow OpenTelemetry's GenAI semantic conventions where they define a metric, translated the
//! standard Prometheus way (dots to underscores, the unit `s` as a `_seconds` suffix, `{token}` dropped);
//! the gateway's own metrics are prefixed `extproc_`.

mod family;
mod scrape;
mod text;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use family::{Family, Histogram, Series};
pub use scrape::{engines, render, EngineView};
pub use text::Exposition;

/// `extproc_phase_duration_seconds` bounds (nanoseconds): 10 µs to 1 s.
static PHASE_BOUNDS: [u64; 16] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];

/// `gen_ai.client.token.usage`'s advised bucket boundaries (tokens).
static TOKEN_BOUNDS: [u64; 14] = [
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
];

/// `gen_ai.server.request.duration`'s advised boundaries, 0.01 s to 81.92 s (nanoseconds).
static REQUEST_DURATION_BOUNDS: [u64; 14] = [
    10_000_000,
    20_000_000,
    40_000_000,
    80_000_000,
    160_000_000,
    320_000_000,
    640_000_000,
    1_280_000_000,
    2_560_000_000,
    5_120_000_000,
    10_240_000_000,
    20_480_000_000,
    40_960_000_000,
    81_920_000_000,
];

/// `gen_ai.server.time_to_first_token`'s advised boundaries, 1 ms to 10 s (nanoseconds).
static TTFT_BOUNDS: [u64; 16] = [
    1_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    40_000_000,
    60_000_000,
    80_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    750_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    7_500_000_000,
    10_000_000_000,
];

/// `gen_ai.server.time_per_output_token`'s advised boundaries, 10 ms to 2.5 s (nanoseconds).
static TPOT_BOUNDS: [u64; 13] = [
    10_000_000,
    25_000_000,
    50_000_000,
    75_000_000,
    100_000_000,
    150_000_000,
    200_000_000,
    300_000_000,
    400_000_000,
    500_000_000,
    750_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// Nanoseconds per second: histograms of durations record nanoseconds.
pub const NANOS: f64 = 1e9;

/// A step of the gateway's own work on a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The JSON request body parsed into a generation request.
    Parse,
    /// The chat template rendered.
    Template,
    /// The prompt text tokenized.
    Tokenize,
    /// The router's pick.
    Route,
    /// The engine's Generate request encoded.
    Encode,
    /// One chunk of the engine's response turned into the client's (per chunk).
    Decode,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Parse,
        Phase::Template,
        Phase::Tokenize,
        Phase::Route,
        Phase::Encode,
        Phase::Decode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Parse => "parse",
            Phase::Template => "template",
            Phase::Tokenize => "tokenize",
            Phase::Route => "route",
            Phase::Encode => "encode",
            Phase::Decode => "decode",
        }
    }

    /// Records the time since `began` as this phase's, and returns now (the next phase's start).
    pub fn observe(self, began: Instant) -> Instant {
        let now = Instant::now();
        let m = global();
        if m.enabled {
            m.phases[self as usize].observe(nanos(now - began));
        }
        now
    }
}

/// Why a request went where it went (or nowhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The pick holds part of the prompt in its prefix cache.
    Hit,
    /// No candidate held any of the prompt.
    Miss,
    /// Another candidate held a longer prefix, but the policy (load) chose this one.
    Spill,
    /// Envoy retried the request on one of the pick's fallbacks (counted besides the pick's reason).
    Fallback,
    /// Refused with a 429: sheddable, and every candidate's queue was full.
    Shed,
    /// No healthy engine: a 503.
    NoEndpoint,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Hit => "hit",
            Decision::Miss => "miss",
            Decision::Spill => "spill",
            Decision::Fallback => "fallback",
            Decision::Shed => "shed",
            Decision::NoEndpoint => "no_endpoint",
        }
    }
}

/// What an ended request was, for `request_ended`.
#[derive(Debug, Default)]
pub struct RequestEnd<'a> {
    pub model: &'a str,
    /// The API's path (`/v1/chat/completions`); empty when the path named no API.
    pub api: &'a str,
    /// `chat` or `text_completion` for a generation request (the GenAI metrics count only those).
    pub operation: Option<&'static str>,
    /// The client's status (0: the stream ended before any answer, e.g. the client went away).
    pub status: u16,
    /// The engine that served it (empty when none did).
    pub engine: &'a str,
    /// An error after a 200 went out (a stream cut short) still makes a request a failure.
    pub failed: bool,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    pub duration: Duration,
    /// From the start to the engine's first output, for a streamed answer.
    pub first_token: Option<Duration>,
}

/// Token counts of one model.
#[derive(Default)]
pub struct Tokens {
    pub prompt: AtomicU64,
    pub cached: AtomicU64,
    pub completion: AtomicU64,
}

pub struct Metrics {
    enabled: bool,
    pub requests: Family<AtomicU64>,
    pub tokens: Family<Tokens>,
    pub token_usage: Family<Histogram>,
    pub request_duration: Family<Histogram>,
    pub time_to_first_token: Family<Histogram>,
    pub time_per_output_token: Family<Histogram>,
    pub phases: [Histogram; 6],
    pub routing: Family<AtomicU64>,
    pub kv_batches: Family<AtomicU64>,
    pub kv_resyncs: Family<AtomicU64>,
    /// Seconds from the engine's batch timestamp to its arrival, of the last batch (f64 bits).
    pub kv_lag: Family<AtomicU64>,
}

impl Metrics {
    pub fn new(enabled: bool) -> Self {
        const GEN_AI: &[&str] = &["gen_ai_operation_name", "gen_ai_request_model"];
        Metrics {
            enabled,
            requests: Family::counter(&["model", "api", "status", "engine"]),
            tokens: Family::new(&["model"], Tokens::default),
            token_usage: Family::histogram(
                &["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type"],
                &TOKEN_BOUNDS,
            ),
            request_duration: Family::histogram(
                &["gen_ai_operation_name", "gen_ai_request_model", "error_type"],
                &REQUEST_DURATION_BOUNDS,
            ),
            time_to_first_token: Family::histogram(GEN_AI, &TTFT_BOUNDS),
            time_per_output_token: Family::histogram(GEN_AI, &TPOT_BOUNDS),
            phases: Phase::ALL.map(|_| Histogram::new(&PHASE_BOUNDS)),
            routing: Family::counter(&["model", "policy", "reason"]),
            kv_batches: Family::counter(&["engine", "outcome"]),
            kv_resyncs: Family::counter(&["engine"]),
            kv_lag: Family::new(&["engine"], || AtomicU64::new(0)),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A request's ext_proc stream ended.
    pub fn request_ended(&self, r: &RequestEnd<'_>) {
        if !self.enabled {
            return;
        }
        let status = status_label(r.status);
        self.requests.add(&[r.model, r.api, status.as_str(), r.engine], 1);
        if r.prompt_tokens + r.cached_tokens + r.completion_tokens > 0 {
            let t = self.tokens.get(&[r.model]);
            t.value.prompt.fetch_add(u64::from(r.prompt_tokens), Ordering::Relaxed);
            t.value.cached.fetch_add(u64::from(r.cached_tokens), Ordering::Relaxed);
            t.value
                .completion
                .fetch_add(u64::from(r.completion_tokens), Ordering::Relaxed);
        }
        let Some(op) = r.operation else { return };
        let failed = r.failed || r.status != 200;
        let error_type = if !failed {
            ""
        } else if r.status == 200 || r.status == 0 {
            "stream_error"
        } else {
            status.as_str()
        };
        self.request_duration
            .get(&[op, r.model, error_type])
            .value
            .observe(nanos(r.duration));
        if failed {
            return;
        }
        let usage = |kind: &str, n: u32| self.token_usage.get(&[op, r.model, kind]).value.observe(u64::from(n));
        usage("input", r.prompt_tokens);
        usage("output", r.completion_tokens);
        if let Some(first) = r.first_token {
            self.time_to_first_token.get(&[op, r.model]).value.observe(nanos(first));
            if r.completion_tokens > 1 {
                let rest = r.duration.saturating_sub(first) / (r.completion_tokens - 1);
                self.time_per_output_token
                    .get(&[op, r.model])
                    .value
                    .observe(nanos(rest));
            }
        }
    }

    /// The router decided for (or against) a request of `model`.
    pub fn routed(&self, model: &str, policy: &str, decision: Decision) {
        if self.enabled {
            self.routing.add(&[model, policy, decision.name()], 1);
        }
    }

    /// A KV-event batch from `engine` was applied with `outcome` (`EventOutcome::kind`); `timestamp`:
    /// the engine's, in Unix seconds (0 when it sent none).
    pub fn kv_batch(&self, engine: &str, outcome: &str, timestamp: f64) {
        if !self.enabled {
            return;
        }
        self.kv_batches.add(&[engine, outcome], 1);
        if timestamp > 0.0 {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let lag = (now - timestamp).max(0.0);
            self.kv_lag.get(&[engine]).value.store(lag.to_bits(), Ordering::Relaxed);
        }
    }

    /// The KV events of `engine` were reset for a new subscription.
    pub fn kv_resync(&self, engine: &str) {
        if self.enabled {
            self.kv_resyncs.add(&[engine], 1);
        }
    }
}

fn status_label(status: u16) -> String {
    status.to_string()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The process's registry; counting is off when `EXTPROC_METRICS` is `0`, `off` or `false`.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let off = std::env::var("EXTPROC_METRICS")
            .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "0" | "off" | "false" | "no"));
        Metrics::new(!off)
    })
}

#[cfg(test)]
mod tests;
