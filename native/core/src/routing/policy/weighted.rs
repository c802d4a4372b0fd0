//! `weighted`: spill gate, then the weighted sum of the configured scorers
//! (`total_e = Σ_s w_s · clamp(score_s(e), 0, 1)`, default prefix 3, queue 2, load 1, kv_usage 1),
//! highest first (ties: less load, then at random); spilled endpoints follow by load.

use super::filter::SpillGate;
use super::picker::{by_load, by_score};
use super::scorer::{combine, Weighted as WeightedScorer};
use super::{PickContext, Policy, PrefixSource};

pub struct Weighted {
    pub scorers: Vec<WeightedScorer>,
    pub gate: SpillGate,
    pub source: PrefixSource,
}

impl Policy for Weighted {
    fn prefix_source(&self) -> PrefixSource {
        self.source
    }

    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let (kept, spilled) = self.gate.split(ctx.candidates);
        let kept_candidates: Vec<_> = kept.iter().map(|&i| ctx.candidates[i]).collect();
        let kept_scores = combine(&self.scorers, &kept_candidates);
        let mut score = vec![f64::NEG_INFINITY; ctx.candidates.len()];
        for (k, &i) in kept.iter().enumerate() {
            score[i] = kept_scores[k];
        }
        let mut order = by_score(ctx, kept, &score);
        order.extend(by_load(ctx, spilled));
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::config::RouterConfig;
    use crate::routing::policy::registry;
    use crate::routing::policy::testing::{cand, first};
    use crate::routing::rng::Rng;

    fn weighted(scorers: &[(&str, f64)], spill_abs: u32) -> Box<dyn Policy> {
        let cfg = RouterConfig {
            scorers: scorers.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            spill_abs,
            ..Default::default()
        };
        registry::policy("weighted", &cfg).unwrap()
    }

    #[test]
    fn prefix_against_load() {
        let rng = Rng::new(0);
        // Endpoint 0 holds 8 of 10 blocks with 6 requests; endpoint 1 is idle and holds nothing.
        let c = [cand(0, 6, 8), cand(1, 0, 0)];
        // prefix 3·0.8 + load 1·0 = 2.4  vs  0 + 1·1 = 1
        assert_eq!(
            first(&*weighted(&[("prefix", 3.0), ("load", 1.0)], 8), &c, None, &rng),
            0
        );
        // prefix 1·0.8 + load 2·0 = 0.8  vs  2
        assert_eq!(
            first(&*weighted(&[("prefix", 1.0), ("load", 2.0)], 8), &c, None, &rng),
            1
        );
    }

    #[test]
    fn kv_usage_breaks_otherwise_equal_endpoints() {
        let rng = Rng::new(0);
        let mut c = [cand(0, 2, 5), cand(1, 2, 5)];
        c[0].load.engine.kv_usage = 0.95;
        assert_eq!(
            first(&*weighted(&[("prefix", 3.0), ("kv_usage", 1.0)], 8), &c, None, &rng),
            1
        );
    }

    #[test]
    fn spill_gate_overrides_scores() {
        let rng = Rng::new(0);
        let mut c = [cand(0, 30, 10), cand(1, 2, 0), cand(2, 3, 0)];
        // All of them waiting for a first token: the gate counts those.
        for x in &mut c {
            x.load.prefilling_requests = x.load.in_flight_requests;
        }
        let p = weighted(&[("prefix", 100.0)], 8);
        let ranking = p.rank(&PickContext {
            candidates: &c,
            session_key: None,
            rng: &rng,
        });
        assert_eq!(ranking.last(), Some(&0), "the overloaded holder is the last fallback");
        assert_ne!(ranking[0], 0);
    }
}
