//! Cache affinity, shared by `prefix_cache` (approximate index) and `kv_events` (precise index):
//!
//! 1. Spill gate (`filter.rs`) removes overloaded endpoints.
//! 2. Among the rest, `best` holds the most leading prompt blocks (ties: less load, then at random)
//!    and `least` is the least loaded.
//! 3. Primary: `best` if `cached(best) >= cached(least) + min_blocks`, else `least`: a cache hit is
//!    worth following only when it saves prefill over simply balancing load.
//! 4. Fallbacks: the other kept endpoints by cached blocks (descending) then load, then the spilled
//!    ones by load.

use super::filter::{least_loaded, SpillGate};
use super::picker::by_load;
use super::{PickContext, PrefixSource};

pub struct Affinity {
    pub source: PrefixSource,
    pub gate: SpillGate,
    pub min_blocks: u32,
}

impl Affinity {
    pub fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let c = ctx.candidates;
        let (kept, spilled) = self.gate.split(c);
        let tie: Vec<u64> = (0..c.len()).map(|_| ctx.rng.next_u64()).collect();
        let mut order = kept;
        order.sort_unstable_by_key(|&i| {
            (
                std::cmp::Reverse(c[i].cached_blocks),
                super::picker::load_key(&c[i]),
                tie[i],
            )
        });
        let least = least_loaded(c, &order);
        if c[order[0]].cached_blocks < c[least].cached_blocks.saturating_add(self.min_blocks) {
            let pos = order.iter().position(|&i| i == least).expect("least is kept");
            order.remove(pos);
            order.insert(0, least);
        }
        order.extend(by_load(ctx, spilled));
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::cand;
    use crate::routing::rng::Rng;

    fn affinity(abs: u32, min_blocks: u32) -> Affinity {
        Affinity {
            source: PrefixSource::Events,
            gate: SpillGate {
                enabled: true,
                abs,
                ratio: 1.5,
            },
            min_blocks,
        }
    }

    fn rank(a: &Affinity, c: &[crate::routing::policy::Candidate]) -> Vec<usize> {
        a.rank(&PickContext {
            candidates: c,
            session_key: None,
            rng: &Rng::new(0),
        })
    }

    #[test]
    fn follows_the_longest_prefix() {
        let c = [cand(0, 2, 3), cand(1, 4, 8), cand(2, 0, 0), cand(3, 3, 5)];
        assert_eq!(rank(&affinity(8, 1), &c), vec![1, 3, 0, 2]);
    }

    #[test]
    fn spill_gate_diverts_from_an_overloaded_holder() {
        let c = [cand(0, 20, 10), cand(1, 4, 0), cand(2, 5, 2)];
        // 20 > 4 + 8 and 20 > 4 * 1.5: the holder is skipped and listed last.
        assert_eq!(rank(&affinity(8, 1), &c), vec![2, 1, 0]);
        assert_eq!(rank(&affinity(16, 1), &c)[0], 0, "within the slack the cache wins");
    }

    #[test]
    fn a_small_gain_goes_to_the_least_loaded() {
        let c = [cand(0, 6, 3), cand(1, 1, 2)];
        assert_eq!(rank(&affinity(8, 2), &c), vec![1, 0]);
        assert_eq!(rank(&affinity(8, 1), &c), vec![0, 1]);
        let cold = [cand(0, 3, 0), cand(1, 1, 0)];
        assert_eq!(rank(&affinity(8, 1), &cold)[0], 1, "nothing cached: least load");
    }
}
