//! Round robin: the k-th pick starts at candidate `k mod n` and lists the others in order after it.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{PickContext, Policy};

#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let n = ctx.candidates.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n).map(|k| (start + k) % n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::{cand, first};
    use crate::routing::rng::Rng;

    #[test]
    fn cycles_through_every_endpoint_in_order() {
        let p = RoundRobin::default();
        let rng = Rng::new(0);
        let c = [cand(3, 9, 0), cand(5, 0, 0), cand(7, 0, 0)];
        let picks: Vec<usize> = (0..6).map(|_| first(&p, &c, None, &rng)).collect();
        assert_eq!(picks, vec![3, 5, 7, 3, 5, 7], "load does not matter");
        let ranking = p.rank(&PickContext {
            candidates: &c,
            session_key: None,
            rng: &rng,
        });
        assert_eq!(ranking, vec![0, 1, 2], "fallbacks follow in order");
    }
}
