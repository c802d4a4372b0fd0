//! Consistent hashing on the session key, by rendezvous (highest random weight) hashing: endpoint `e`
//! scores `mix64(xxh3(key) ^ hash(address_e))` and the highest wins; the fallbacks are the next
//! highest. A key keeps its endpoint while that endpoint is a candidate, and removing an endpoint
//! moves only the keys it held. Requests without a key go to the least loaded endpoint.

use xxhash_rust::xxh3::xxh3_64;

use super::picker::by_load;
use super::{PickContext, Policy};
use crate::routing::mix_hash::mix64;

pub struct ConsistentHash;

impl Policy for ConsistentHash {
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        let n = ctx.candidates.len();
        let Some(key) = ctx.session_key.filter(|k| !k.is_empty()) else {
            return by_load(ctx, (0..n).collect());
        };
        let k = xxh3_64(key.as_bytes());
        let mut order: Vec<(u64, usize)> = ctx
            .candidates
            .iter()
            .enumerate()
            .map(|(i, c)| (mix64(k ^ c.address_hash), i))
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        order.into_iter().map(|(_, i)| i).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::policy::testing::{cand, first};
    use crate::routing::rng::Rng;

    #[test]
    fn stable_ignores_load_and_spreads() {
        let rng = Rng::new(0);
        let c: Vec<_> = (0..8).map(|i| cand(i, 0, 0)).collect();
        let mut counts = [0; 8];
        for u in 0..8000 {
            let key = format!("user-{u}");
            let e = first(&ConsistentHash, &c, Some(&key), &rng);
            counts[e] += 1;
            let mut loaded = c.clone();
            loaded[e].load.in_flight_requests = 100;
            assert_eq!(
                first(&ConsistentHash, &loaded, Some(&key), &rng),
                e,
                "same key, same endpoint"
            );
        }
        assert!(counts.iter().all(|&n| (800..1200).contains(&n)), "{counts:?}");
    }

    #[test]
    fn removing_an_endpoint_moves_only_its_keys() {
        let rng = Rng::new(0);
        let c: Vec<_> = (0..6).map(|i| cand(i, 0, 0)).collect();
        let without_2: Vec<_> = c.iter().copied().filter(|x| x.id != 2).collect();
        for u in 0..2000 {
            let key = format!("session-{u}");
            let before = first(&ConsistentHash, &c, Some(&key), &rng);
            let after = first(&ConsistentHash, &without_2, Some(&key), &rng);
            if before != 2 {
                assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn no_key_means_least_load() {
        let rng = Rng::new(0);
        let c = vec![cand(0, 3, 0), cand(1, 1, 0)];
        assert_eq!(first(&ConsistentHash, &c, None, &rng), 1);
        assert_eq!(first(&ConsistentHash, &c, Some(""), &rng), 1);
    }
}
