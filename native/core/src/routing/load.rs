//! An endpoint's load as the policies see it: the gateway's own in-flight accounting (fresh, but blind
//! to other gateways' traffic) merged with the engine's last report (complete, but a step or a poll old).

use crate::pb::kv_events as pb;

/// What an engine reports about itself, from a `GetLoads` poll (built in Python, handed over as the
/// binding's `EngineLoad`) or an `EngineLoad` record on its KV-event stream (`From<&pb::EngineLoad>`).
/// The one load type the router takes, whichever way the report came.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    pub running: u32,
    pub waiting: u32,
    /// KV-cache utilization in [0, 1].
    pub kv_usage: f64,
    /// The engine's admission window (max running requests); 0 when unknown.
    pub max_running: u32,
    /// Prompt tokens of its waiting requests not served from its prefix cache: queued prefill work
    /// (`GetLoads`' `num_waiting_uncached_tokens`); 0 when not reported.
    pub waiting_uncached_tokens: u32,
}

impl EngineLoad {
    /// A reported KV-cache usage as a fraction: clamped to [0, 1], NaN read as 0.
    pub fn usage_fraction(reported: f64) -> f64 {
        if reported.is_nan() {
            0.0
        } else {
            reported.clamp(0.0, 1.0)
        }
    }
}

impl From<&pb::EngineLoad> for EngineLoad {
    fn from(l: &pb::EngineLoad) -> Self {
        EngineLoad {
            running: l.running_requests,
            waiting: l.waiting_requests,
            kv_usage: EngineLoad::usage_fraction(l.token_usage),
            max_running: l.max_running_requests,
            waiting_uncached_tokens: l.waiting_uncached_tokens.unwrap_or(0),
        }
    }
}

/// One endpoint's load at the moment of a pick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Requests this gateway sent to the endpoint that have not finished.
    pub in_flight_requests: u32,
    /// Prompt tokens of those requests.
    pub in_flight_tokens: u64,
    /// Uncached prompt tokens of those requests that have no first token yet: prefill work the
    /// endpoint still has to do for this gateway.
    pub prefill_tokens: u64,
    /// Those of `in_flight_requests` that have no first token yet.
    pub prefilling_requests: u32,
    pub engine: EngineLoad,
}

impl Load {
    /// Requests on the endpoint: `max(in_flight, running + waiting)` — the larger of our own count and
    /// the engine's, so neither a stale report nor other gateways' traffic hides load.
    pub fn requests(&self) -> u32 {
        self.in_flight_requests.max(self.engine.running + self.engine.waiting)
    }

    /// Prefill work ahead of a new request, in tokens: the larger of our own pending prefill and the
    /// engine's queued uncached tokens.
    pub fn prefill_backlog(&self) -> u64 {
        self.prefill_tokens.max(u64::from(self.engine.waiting_uncached_tokens))
    }

    /// Requests still waiting for their first token: the larger of our own count and the engine's
    /// queue (`max(prefilling, waiting)`). A request past its first token only decodes, which delays a
    /// new prompt's first token by a step's share, not by a prefill.
    pub fn awaiting_first_token(&self) -> u32 {
        self.prefilling_requests.max(self.engine.waiting)
    }

    /// Requests queued rather than running: `max(waiting, in_flight - running)`.
    pub fn queue(&self) -> u32 {
        self.engine
            .waiting
            .max(self.in_flight_requests.saturating_sub(self.engine.running))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_counts() {
        let l = Load {
            in_flight_requests: 5,
            in_flight_tokens: 0,
            prefill_tokens: 0,
            prefilling_requests: 2,
            engine: EngineLoad {
                running: 2,
                waiting: 1,
                ..Default::default()
            },
        };
        assert_eq!((l.requests(), l.queue(), l.awaiting_first_token()), (5, 3, 2));
        let busy_elsewhere = Load {
            in_flight_requests: 1,
            engine: EngineLoad {
                running: 8,
                waiting: 4,
                ..Default::default()
            },
            ..l
        };
        assert_eq!(
            (
                busy_elsewhere.requests(),
                busy_elsewhere.queue(),
                busy_elsewhere.awaiting_first_token()
            ),
            (12, 4, 4)
        );
    }

    #[test]
    fn a_kv_event_load_record_keeps_every_field_the_router_reads() {
        let record = pb::EngineLoad {
            running_requests: 3,
            waiting_requests: 2,
            waiting_uncached_tokens: Some(640),
            token_usage: 1.5,
            max_running_requests: 8,
            ..Default::default()
        };
        let expected = EngineLoad {
            running: 3,
            waiting: 2,
            kv_usage: 1.0,
            max_running: 8,
            waiting_uncached_tokens: 640,
        };
        assert_eq!(EngineLoad::from(&record), expected);
        let odd = pb::EngineLoad {
            token_usage: f64::NAN,
            ..Default::default()
        };
        assert_eq!(EngineLoad::from(&odd), EngineLoad::default());
    }
}
