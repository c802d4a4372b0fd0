//! Power of two choices: draw two distinct candidates at random, take the less loaded (by `(requests,
//! in-flight tokens)`), list the other next, then the rest by load.

use super::picker::{by_load, load_key};
use super::{PickContext, Policy};

pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let n = ctx.candidates.len();
        if n == 1 {
            return vec![0];
        }
        let a = ctx.rng.below(n);
        let mut b = ctx.rng.below(n - 1);
        if b >= a {
            b += 1;
        }
        let (win, lose) = if load_key(&ctx.candidates[b]) < load_key(&ctx.candidates[a]) {
            (b, a)
        } else {
            (a, b)
        };
        let mut order = vec![win, lose];
        order.extend(by_load(ctx, (0..n).filter(|&i| i != a && i != b).collect()));
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::{cand, first};
    use crate::routing::rng::Rng;

    #[test]
    fn never_picks_the_worst_and_reaches_all_but_it() {
        let rng = Rng::new(3);
        let c: Vec<_> = [4, 1, 7, 3, 9]
            .iter()
            .enumerate()
            .map(|(i, &r)| cand(i, r, 0))
            .collect();
        let mut counts = [0; 5];
        for _ in 0..5000 {
            counts[first(&PowerOfTwo, &c, None, &rng)] += 1;
        }
        assert_eq!(counts[4], 0, "the most loaded loses every pair it is drawn in");
        assert!(counts[1] > counts[0] && counts[0] > counts[2], "{counts:?}");
        assert!(counts[2] > 0, "the second worst still wins against the worst");
    }

    #[test]
    fn the_loser_of_the_pair_is_the_first_fallback() {
        let rng = Rng::new(5);
        let c = vec![cand(0, 1, 0), cand(1, 2, 0)];
        let ranking = PowerOfTwo.rank(&PickContext {
            candidates: &c,
            session_key: None,
            rng: &rng,
        });
        assert_eq!(ranking, vec![0, 1]);
        assert_eq!(first(&PowerOfTwo, &c[..1], None, &rng), 0);
    }
}
