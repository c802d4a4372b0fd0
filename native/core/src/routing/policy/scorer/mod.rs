//! Scorers: each maps every candidate to a raw score meant to lie in [0, 1], higher is better. The
//! framework (`combine`) clamps each score to [0, 1], multiplies it by the scorer's weight, and sums:
//! `total_e = Σ_s w_s · clamp(score_s(e), 0, 1)`. Scorers never see weights.

pub mod kv_usage;
pub mod load;
pub mod prefix;
pub mod queue;

use super::Candidate;

pub trait Scorer: Send + Sync {
    /// Writes the raw score of each candidate into `out` (same length).
    fn score(&self, candidates: &[Candidate], out: &mut [f64]);
}

pub struct Weighted {
    pub scorer: Box<dyn Scorer>,
    pub weight: f64,
}

/// The weighted sum of the clamped scores of every candidate.
pub fn combine(scorers: &[Weighted], candidates: &[Candidate]) -> Vec<f64> {
    let mut total = vec![0.0; candidates.len()];
    let mut raw = vec![0.0; candidates.len()];
    for s in scorers {
        if s.weight == 0.0 {
            continue;
        }
        s.scorer.score(candidates, &mut raw);
        for (t, r) in total.iter_mut().zip(&raw) {
            // NaN counts as 0: a scorer bug must not poison the ranking.
            let clamped = if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) };
            *t += s.weight * clamped;
        }
    }
    total
}

/// `1 - (x_e - x_min) / max(x_max, 1)`: 1 for the least, down to 0 for a maximum far above it.
pub(crate) fn relative_excess(values: impl Iterator<Item = f64> + Clone, out: &mut [f64]) {
    let min = values.clone().fold(f64::INFINITY, f64::min);
    let max = values.clone().fold(0.0, f64::max).max(1.0);
    for (o, x) in out.iter_mut().zip(values) {
        *o = 1.0 - (x - min) / max;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;

    struct Fixed(Vec<f64>);
    impl Scorer for Fixed {
        fn score(&self, _: &[Candidate], out: &mut [f64]) {
            out.copy_from_slice(&self.0);
        }
    }

    #[test]
    fn the_framework_clamps_and_weights() {
        let c = [cand(0, 0, 0), cand(1, 0, 0), cand(2, 0, 0)];
        let scorers = vec![
            Weighted {
                scorer: Box::new(Fixed(vec![2.0, -1.0, 0.5])),
                weight: 2.0,
            },
            Weighted {
                scorer: Box::new(Fixed(vec![0.0, f64::NAN, 1.0])),
                weight: 1.0,
            },
        ];
        assert_eq!(combine(&scorers, &c), vec![2.0, 0.0, 2.0]);
    }
}
