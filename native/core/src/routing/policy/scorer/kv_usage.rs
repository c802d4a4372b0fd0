//! KV-cache headroom: `1 - kv_usage`, the engine's reported KV utilization in [0, 1]. An engine near
//! full must evict (or preempt) to admit more, which costs other requests' cached prefixes.

use super::Scorer;
use crate::routing::policy::Candidate;

pub struct KvUsageScorer;

impl Scorer for KvUsageScorer {
    fn score(&self, candidates: &[Candidate], out: &mut [f64]) {
        for (o, c) in out.iter_mut().zip(candidates) {
            *o = 1.0 - c.load.engine.kv_usage;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;

    #[test]
    fn headroom() {
        let mut c = [cand(0, 0, 0), cand(1, 0, 0)];
        c[0].load.engine.kv_usage = 0.9;
        let mut out = [0.0; 2];
        KvUsageScorer.score(&c, &mut out);
        assert!((out[0] - 0.1).abs() < 1e-12 && out[1] == 1.0);
    }
}
