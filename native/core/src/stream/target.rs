//! Where a prompt goes: the router's pick, resolved once into the engine's address, the data-parallel
//! rank the request is pinned to, the engine's protocol, its fallbacks and the load the request holds
//! there. The stream, the summary, the abort and a batch's calls all read this one value.

use std::sync::Arc;
use std::time::Instant;

use super::epp;
use crate::engine::Protocol;
use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::metrics::{self, Decision, Phase};
use crate::routing::{Failure, InFlight, NoRoute, Pick, PickRequest};

pub struct Target {
    /// The engine's address (never an endpoint's `#rank` name): where Envoy connects.
    pub address: String,
    /// The data-parallel rank the request is pinned to (it travels in the Generate request), if any.
    pub dp_rank: Option<u32>,
    pub protocol: Protocol,
    /// The router's next best engines that speak `protocol`, in order: fallbacks must take the same
    /// request bytes (for a pinned rank the router already kept only engines with that rank).
    fallbacks: Vec<Arc<str>>,
    /// Counts the request as in flight on the endpoint (load for the router) until dropped.
    pub in_flight: Option<InFlight>,
}

impl Target {
    /// The next best engines, in order.
    pub fn fallbacks(&self) -> &[Arc<str>] {
        &self.fallbacks
    }

    /// The destination header and metadata value: the address, then at most `max_fallbacks` fallbacks.
    pub fn destination(&self, max_fallbacks: usize) -> String {
        epp::destination(&self.address, &self.fallbacks, max_fallbacks)
    }

    /// Envoy reports that `upstream` answered (a fallback of the pick): the request now counts there,
    /// on the rank it is pinned to (rank 0 without one). Unchanged when the router does not know it.
    pub fn follow(&mut self, model: &ServedModel, upstream: &str, prompt_tokens: u64) {
        metrics::global().routed(&model.name, model.router.policy_name(), Decision::Fallback);
        if let Some(in_flight) = model.router.begin(upstream, self.dp_rank, prompt_tokens) {
            self.in_flight = Some(in_flight);
            self.address = upstream.to_string();
        }
    }
}

/// What an engine call's gRPC status says about its endpoint (`routing/penalty.rs`): `None` when
/// nothing (the call was cancelled), `Ok` when the engine is alive (it answered, even with a refusal
/// of the request itself), else how it failed.
pub fn grpc_outcome(code: u32) -> Option<Result<(), Failure>> {
    match code {
        1 => None,                                   // CANCELLED: the client or the gateway gave up
        2 | 4 | 13 | 14 => Some(Err(Failure::Down)), // UNKNOWN, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE
        8 => Some(Err(Failure::Busy)),               // RESOURCE_EXHAUSTED
        _ => Some(Ok(())),
    }
}

impl Target {
    /// Tell the router how the call on this target ended.
    pub fn report(&self, model: &ServedModel, outcome: Result<(), Failure>) {
        model.router.report(&self.address, self.dp_rank, outcome);
    }
}

/// The engine for `request`'s prompt among its subset hint when there is one; 503 when none is ready,
/// 429 when every one is at its queue limit and the request's priority is sheddable.
pub fn pick(model: &ServedModel, request: PickRequest<'_>) -> Result<Target, ApiError> {
    let began = Instant::now();
    let decided = model.router.route(&request);
    Phase::Route.observe(began);
    metrics::global().routed(&model.name, model.router.policy_name(), decision(&decided));
    let pick = decided.map_err(|why| no_route(model, &request, why))?;
    let address = pick.address().to_string();
    let protocol = model.protocol(&address);
    Ok(Target {
        dp_rank: pick.rank(),
        protocol,
        fallbacks: pick
            .fallbacks
            .into_iter()
            .filter(|f| model.protocol(f) == protocol)
            .collect(),
        in_flight: Some(pick.in_flight),
        address,
    })
}

/// The router's decision as the metrics name it.
fn decision(decided: &Result<Pick, NoRoute>) -> Decision {
    match decided {
        Ok(p) if p.best_cached_blocks > p.cached_blocks => Decision::Spill,
        Ok(p) if p.cached_blocks > 0 => Decision::Hit,
        Ok(_) => Decision::Miss,
        Err(NoRoute::Overloaded) => Decision::Shed,
        Err(NoRoute::NoEndpoint) => Decision::NoEndpoint,
    }
}

fn no_route(model: &ServedModel, request: &PickRequest<'_>, why: NoRoute) -> ApiError {
    match why {
        NoRoute::NoEndpoint => {
            let within = if request.subset.is_some() {
                " among the engines of the subset hint"
            } else {
                ""
            };
            ApiError::unavailable(format!("no engine is ready to serve model '{}'{within}", model.name))
        }
        NoRoute::Overloaded => {
            let priority = model.router.priority(request.objective);
            let class = match request.objective {
                Some(name) => format!("objective '{name}' (priority {priority})"),
                None => format!("no objective (priority {priority})"),
            };
            ApiError::new(
                429,
                "rate_limit_error",
                format!(
                    "every engine of model '{}' is at its queue limit; requests of {class} are shed; retry later",
                    model.name
                ),
            )
        }
    }
}
