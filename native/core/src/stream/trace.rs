//! A request's trace record: its W3C trace context (the client's `traceparent` joined, or a new trace)
//! and the wall-clock times its phases began and ended. The data plane only records them; the control
//! plane turns finished records into OpenTelemetry spans and a log line, in batches, off the request path.
//!
//! A trace context is made only when tracing is on (`Gateway::set_tracing`): off, no ids are drawn.
//! The engine call gets a `traceparent` of the same trace whose parent is the engine-call span
//! (`engine_span_id`), which the control plane creates with that id.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::pb::ext_proc::{processing_response::Response, HeaderMutation, ProcessingResponse};

pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The trace a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// The client's span (from its `traceparent`): the request span's parent. None: a new trace.
    pub parent_span_id: Option<u64>,
    /// The span id the engine call is made under, sent to the engine as its parent.
    pub engine_span_id: u64,
    /// W3C trace flags: bit 0 is "sampled" (the client's, or sampled for a new trace).
    pub flags: u8,
}

impl TraceContext {
    /// The context of a request that came with `traceparent` (joined if valid, else a new trace).
    pub fn start(traceparent: Option<&str>) -> TraceContext {
        match traceparent.and_then(parse_traceparent) {
            Some((trace_id, span_id, flags)) => TraceContext {
                trace_id,
                parent_span_id: Some(span_id),
                engine_span_id: random_id(),
                flags,
            },
            None => TraceContext {
                trace_id: (u128::from(random_id()) << 64) | u128::from(random_id()),
                parent_span_id: None,
                engine_span_id: random_id(),
                flags: 1,
            },
        }
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` the engine call carries: this trace, the engine-call span as parent.
    pub fn engine_traceparent(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.engine_span_id, self.flags
        )
    }

    /// Set the engine call's `traceparent` on the request-headers reply that routes it (it replaces
    /// the client's own, which the engine call would otherwise carry).
    pub fn add_to(&self, routing_reply: &mut ProcessingResponse) {
        if let Some(Response::RequestHeaders(h)) = routing_reply.response.as_mut() {
            if let Some(common) = h.response.as_mut() {
                common
                    .header_mutation
                    .get_or_insert_with(HeaderMutation::default)
                    .set(TRACEPARENT_HEADER, &self.engine_traceparent());
            }
        }
    }
}

/// `(trace id, parent span id, flags)` of a W3C `traceparent` header; None if it is not valid
/// (then the request starts a trace of its own, as the W3C recommendation says).
pub fn parse_traceparent(value: &str) -> Option<(u128, u64, u8)> {
    let value = value.trim();
    let bytes = value.as_bytes();
    // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2; a later version may
    // append fields after another "-".
    if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let version = &value[0..2];
    if version == "ff" || (version == "00" && bytes.len() != 55) || (bytes.len() > 55 && bytes[55] != b'-') {
        return None;
    }
    let lower_hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let (trace, span, flags) = (&value[3..35], &value[36..52], &value[53..55]);
    if !(lower_hex(version) && lower_hex(trace) && lower_hex(span) && lower_hex(flags)) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace, 16).ok()?;
    let span_id = u64::from_str_radix(span, 16).ok()?;
    if trace_id == 0 || span_id == 0 {
        return None;
    }
    Some((trace_id, span_id, u8::from_str_radix(flags, 16).ok()?))
}

/// A non-zero id, unpredictable enough for tracing (not for security): a per-process random seed,
/// mixed with a counter.
fn random_id() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now_ns().into());
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let id = xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), seed);
    id.max(1)
}

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// When a request's phases happened, in nanoseconds since the Unix epoch; 0: it never got there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// The request headers arrived.
    pub received_ns: u64,
    /// The whole body arrived: parsing starts.
    pub body_ns: u64,
    /// The body is parsed: templating and tokenizing start.
    pub parsed_ns: u64,
    /// The prompt is token ids: routing starts.
    pub tokenized_ns: u64,
    /// An engine was picked and the call encoded: the engine call starts.
    pub routed_ns: u64,
    /// The engine's first bytes came back (its prefill is done).
    pub first_token_ns: u64,
    /// The stream ended.
    pub finished_ns: u64,
}

impl Timings {
    /// `(name, time)` of each phase boundary reached, in order.
    pub fn reached(&self) -> Vec<(&'static str, u64)> {
        [
            ("received", self.received_ns),
            ("body", self.body_ns),
            ("parsed", self.parsed_ns),
            ("tokenized", self.tokenized_ns),
            ("routed", self.routed_ns),
            ("first_token", self.first_token_ns),
            ("finished", self.finished_ns),
        ]
        .into_iter()
        .filter(|(_, t)| *t != 0)
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_joined() {
        let t = TraceContext::start(Some(CLIENT));
        assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(t.parent_span_id, Some(0x00f067aa0ba902b7));
        assert!(t.sampled());
        let sent = t.engine_traceparent();
        assert!(sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{sent}");
        assert_eq!(parse_traceparent(&sent), Some((t.trace_id, t.engine_span_id, 1)));
        assert_ne!(t.engine_span_id, 0x00f067aa0ba902b7);
    }

    #[test]
    fn invalid_traceparents_start_a_new_trace() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
            let t = TraceContext::start(Some(bad));
            assert_eq!(t.parent_span_id, None);
            assert_ne!(t.trace_id, 0);
        }
        // A later version may carry more fields.
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x").is_some());
    }

    #[test]
    fn new_traces_and_spans_get_distinct_ids() {
        let a = TraceContext::start(None);
        let b = TraceContext::start(None);
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.engine_span_id, b.engine_span_id);
        assert!(a.sampled());
    }

    #[test]
    fn only_reached_phases_are_listed() {
        let t = Timings {
            received_ns: 1,
            body_ns: 2,
            finished_ns: 9,
            ..Timings::default()
        };
        assert_eq!(t.reached(), [("received", 1), ("body", 2), ("finished", 9)]);
    }
}
