//! Routing policies. Each ranks the candidate endpoints of one request, best first: the router sends
//! the request to the first and lists the next ones as fallbacks. Candidates arrive already filtered
//! (healthy, inside the subset Envoy asked for) with their loads and, for policies that read a prefix
//! index, how many leading prompt blocks each holds.
//!
//! Structure (after the Gateway API Inference Extension's endpoint picker): filters (`filter.rs`) →
//! weighted scorers (`scorer/`, one file each, weights and clamping applied by the framework) →
//! picker (`picker.rs`); every policy and scorer is registered by type name in `registry.rs`.

pub mod affinity;
pub mod consistent_hash;
pub mod filter;
pub mod kv_events;
pub mod least_load;
pub mod picker;
pub mod power_of_two;
pub mod prefix_cache;
pub mod random;
pub mod registry;
pub mod round_robin;
pub mod scorer;
pub mod weighted;

#[cfg(test)]
pub(crate) mod testing;

use super::endpoint_set::EndpointId;
use super::load::Load;
use super::rng::Rng;

/// Which prefix index a policy reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixSource {
    /// None: the router does not hash the prompt.
    None,
    /// The precise index fed by engine KV events.
    Events,
    /// The approximate index learned from routing decisions (the router records each pick in it).
    Routed,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Candidate {
    pub id: EndpointId,
    /// Hash of the endpoint's address (consistent hashing).
    pub address_hash: u64,
    pub load: Load,
    /// Leading blocks of the prompt the endpoint holds, per the policy's index (0 without one).
    pub cached_blocks: u32,
    /// Full blocks of the prompt at the endpoint's block size (0 without an index).
    pub prompt_blocks: u32,
    /// The prompt's length in tokens.
    pub prompt_tokens: u32,
    /// The endpoint's KV block size (0 when unknown).
    pub block_size: u32,
    /// The endpoint's tie break (`load_order.rs`): the affinity ranking orders equal keys by it, then
    /// by id.
    pub tie: u64,
    /// Sessions resident on the endpoint, for a new session's request (`residents.rs`; 0 otherwise).
    pub residents: u32,
    /// The endpoint is fresh (`fresh_cache_weight`): its events show no cached block and nothing is on
    /// it. Set only when that setting is on.
    pub fresh: bool,
    /// The endpoint is underused for this request (`underused_share`): a new request, and the
    /// endpoint's recent requests are below that share of the healthy endpoints' mean. Set only when that
    /// setting is on.
    pub underused: bool,
    /// How far the endpoint's recent requests exceed the healthy endpoints' mean, as a share of it
    /// (`busy_miss_weight`): recent / mean - 1 when above it, else 0. Set only when that setting is on.
    pub busy: f64,
}

impl Candidate {
    /// Prompt tokens the endpoint would have to prefill: those past its cached leading blocks.
    pub fn uncached_tokens(&self) -> u32 {
        self.prompt_tokens
            .saturating_sub(self.cached_blocks.saturating_mul(self.block_size))
    }
}

/// What a policy's ranking of the candidates holding none of the prompt depends on: those `gate`
/// keeps (given the least loaded candidate's requests) come first, in the order of
/// `base_wait(load, request_cost)`, requests, in-flight tokens, tie, id; those it spills come after
/// every kept candidate (holders too), in the order of requests, in-flight tokens, tie, id, mixed with
/// the spilled holders by that same order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WaitOrder {
    pub request_cost: u32,
    pub gate: filter::SpillGate,
}

pub struct PickContext<'a> {
    /// Never empty.
    pub candidates: &'a [Candidate],
    /// The request's session key (the `x-session-id` header or the `user` field), if any.
    pub session_key: Option<&'a str>,
    pub rng: &'a Rng,
}

pub trait Policy: Send + Sync {
    fn prefix_source(&self) -> PrefixSource {
        PrefixSource::None
    }

    /// `Some` for a policy that ranks the candidates holding none of the prompt in the router's load
    /// order (`load_order.rs`): see `WaitOrder`. The router may then rank a shortlist: the prompt's
    /// holders, the least loaded endpoint and the first few endpoints of each order.
    fn wait_order(&self) -> Option<WaitOrder> {
        None
    }

    /// A permutation of `0..ctx.candidates.len()`, best first.
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize>;

    /// The first `k` of what `rank` would return (all of it when `k` covers every candidate), drawing
    /// the same random numbers. The router needs the primary and its fallbacks only: a policy that can
    /// select those without ordering every candidate overrides this.
    fn rank_top(&self, ctx: &PickContext<'_>, k: usize) -> Vec<usize> {
        let mut ranking = self.rank(ctx);
        ranking.truncate(k);
        ranking
    }
}
