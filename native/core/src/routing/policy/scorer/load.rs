//! Requests on the endpoint: with `r_e = Load::requests()` (`max(in_flight, running + waiting)`),
//! score `1 - (r_e - r_min) / max(r_max, 1)`.

use super::{relative_excess, Scorer};
use crate::routing::policy::Candidate;

pub struct LoadScorer;

impl Scorer for LoadScorer {
    fn score(&self, candidates: &[Candidate], out: &mut [f64]) {
        relative_excess(candidates.iter().map(|c| f64::from(c.load.requests())), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;

    #[test]
    fn fewer_requests_score_higher() {
        let c = [cand(0, 10, 0), cand(1, 20, 0)];
        let mut out = [0.0; 2];
        LoadScorer.score(&c, &mut out);
        assert_eq!(out, [1.0, 0.5]);
    }
}
