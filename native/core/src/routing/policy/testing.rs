//! Test helpers: candidates with a given load and cached prefix, and a context over them.

use super::{Candidate, PickContext, Policy};
use crate::routing::load::{EngineLoad, Load};
use crate::routing::rng::Rng;

/// Endpoint `id` with `requests` in flight holding `cached` of 10 prompt blocks.
pub fn cand(id: usize, requests: u32, cached: u32) -> Candidate {
    Candidate {
        id,
        address_hash: xxhash_rust::xxh3::xxh3_64(format!("10.0.0.{id}:8000").as_bytes()),
        load: Load {
            in_flight_requests: requests,
            in_flight_tokens: 0,
            prefill_tokens: 0,
            prefilling_requests: 0,
            engine: EngineLoad::default(),
        },
        cached_blocks: cached,
        prompt_blocks: 10,
        prompt_tokens: 160,
        block_size: 16,
        tie: 0,
        residents: 0,
        fresh: false,
        underused: false,
        busy: 0.0,
    }
}

/// The candidate id `policy` puts first.
pub fn first(policy: &dyn Policy, candidates: &[Candidate], key: Option<&str>, rng: &Rng) -> usize {
    let ranking = policy.rank(&PickContext {
        candidates,
        session_key: key,
        rng,
    });
    let mut sorted = ranking.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..candidates.len()).collect::<Vec<_>>(),
        "a ranking is a permutation"
    );
    candidates[ranking[0]].id
}
