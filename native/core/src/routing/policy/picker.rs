//! Orderings shared by the policies: by load, and by score with load as the tie break. Remaining ties
//! are broken at random so that equal endpoints share traffic instead of the first taking it all.

use super::{Candidate, PickContext};

/// The load order: fewer requests (ours or the engine's, whichever is larger), then fewer tokens.
pub fn load_key(c: &Candidate) -> (u32, u64) {
    (c.load.requests(), c.load.in_flight_tokens)
}

/// `indices` sorted least loaded first.
pub fn by_load(ctx: &PickContext<'_>, mut indices: Vec<usize>) -> Vec<usize> {
    let tie: Vec<u64> = (0..ctx.candidates.len()).map(|_| ctx.rng.next_u64()).collect();
    indices.sort_unstable_by_key(|&i| (load_key(&ctx.candidates[i]), tie[i]));
    indices
}

/// `indices` sorted by `score[i]` descending, ties by load, then at random.
pub fn by_score(ctx: &PickContext<'_>, mut indices: Vec<usize>, score: &[f64]) -> Vec<usize> {
    let tie: Vec<u64> = (0..ctx.candidates.len()).map(|_| ctx.rng.next_u64()).collect();
    indices.sort_unstable_by(|&a, &b| {
        score[b]
            .total_cmp(&score[a])
            .then_with(|| load_key(&ctx.candidates[a]).cmp(&load_key(&ctx.candidates[b])))
            .then_with(|| tie[a].cmp(&tie[b]))
    });
    indices
}
