//! Prefix-hit fraction: `cached_blocks / prompt_blocks` — the share of the prompt's full blocks the
//! endpoint already holds as a leading prefix (0 for a prompt shorter than one block).

use super::Scorer;
use crate::routing::policy::Candidate;

pub struct PrefixScorer;

impl Scorer for PrefixScorer {
    fn score(&self, candidates: &[Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(candidates) {
            *o = if c.prompt_blocks == 0 {
                0.0
            } else {
                f64::from(c.cached_blocks) / f64::from(c.prompt_blocks)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;

    #[test]
    fn fraction_of_blocks_held() {
        let mut c = [cand(0, 0, 5), cand(1, 0, 10), cand(2, 0, 0)];
        c[2].prompt_blocks = 0;
        let mut out = [0.0; 3];
        PrefixScorer.score(&c, &mut out);
        assert_eq!(out, [0.5, 1.0, 0.0]);
    }
}
