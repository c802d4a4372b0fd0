//! Queue depth: with `q_e = Load::queue()` (requests waiting rather than running:
//! `max(engine waiting, in_flight - engine running)`), score `1 - (q_e - q_min) / max(q_max, 1)`.

use super::{relative_excess, Scorer};
use crate::routing::policy::Candidate;

pub struct QueueScorer;

impl Scorer for QueueScorer {
    fn score(&self, candidates: &[Candidate], out: &mut [f64]) {
        relative_excess(candidates.iter().map(|c| f64::from(c.load.queue())), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;

    #[test]
    fn shorter_queue_scores_higher() {
        let c = [cand(0, 4, 0), cand(1, 8, 0), cand(2, 0, 0)];
        let mut out = [0.0; 3];
        QueueScorer.score(&c, &mut out);
        assert_eq!(out, [0.5, 0.0, 1.0]);
        let idle = [cand(0, 0, 0), cand(1, 0, 0)];
        let mut out = [0.0; 2];
        QueueScorer.score(&idle, &mut out);
        assert_eq!(out, [1.0, 1.0]);
    }
}
