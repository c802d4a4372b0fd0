//! Random: a uniformly random order (Fisher-Yates over the policy's shared random source).

use super::{PickContext, Policy};

pub struct Random;

impl Policy for Random {
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let mut order: Vec<usize> = (0..ctx.candidates.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, ctx.rng.below(i + 1));
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::{cand, first};
    use crate::routing::rng::Rng;

    #[test]
    fn spreads_uniformly() {
        let rng = Rng::new(7);
        let c: Vec<_> = (0..4).map(|i| cand(i, 0, 0)).collect();
        let mut counts = [0; 4];
        for _ in 0..8000 {
            counts[first(&Random, &c, None, &rng)] += 1;
        }
        assert!(counts.iter().all(|&n| (1800..2200).contains(&n)), "{counts:?}");
    }
}
