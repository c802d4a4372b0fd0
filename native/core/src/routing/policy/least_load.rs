//! Least load: ascending `(requests, in-flight tokens)`, with `requests = max(in_flight, running +
//! waiting)`; ties at random.

use super::picker::by_load;
use super::{PickContext, Policy};

pub struct LeastLoad;

impl Policy for LeastLoad {
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        by_load(ctx, (0..ctx.candidates.len()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::{cand, first};
    use crate::routing::rng::Rng;

    #[test]
    fn picks_the_minimum_and_orders_fallbacks_by_load() {
        let rng = Rng::new(1);
        let mut c = vec![cand(0, 5, 0), cand(1, 2, 0), cand(2, 9, 0), cand(3, 3, 0)];
        assert_eq!(first(&LeastLoad, &c, None, &rng), 1);
        assert_eq!(
            LeastLoad.rank(&PickContext {
                candidates: &c,
                session_key: None,
                rng: &rng
            }),
            vec![1, 3, 0, 2]
        );
        // The engine's report counts when it shows more than our own accounting.
        c[1].load.engine.waiting = 20;
        assert_eq!(first(&LeastLoad, &c, None, &rng), 3);
    }

    #[test]
    fn ties_are_shared() {
        let rng = Rng::new(1);
        let c = vec![cand(0, 1, 0), cand(1, 1, 0), cand(2, 4, 0)];
        let mut counts = [0; 3];
        for _ in 0..1000 {
            counts[first(&LeastLoad, &c, None, &rng)] += 1;
        }
        assert!(counts[0] > 400 && counts[1] > 400 && counts[2] == 0, "{counts:?}");
    }
}
