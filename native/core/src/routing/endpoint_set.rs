//! A set of endpoint ids as a fixed 128-bit bitset: the per-block membership of the precise index, and
//! the candidate set a match is restricted to. Intersections are two ANDs.

use super::membership::{Membership, Tick};

/// Endpoint ids are `0..MAX_ENDPOINTS`, assigned by the router (one router per served model).
pub const MAX_ENDPOINTS: usize = 128;

pub type EndpointId = usize;

#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct EndpointSet([u64; 2]);

impl EndpointSet {
    pub const EMPTY: EndpointSet = EndpointSet([0, 0]);

    pub fn of(ids: impl IntoIterator<Item = EndpointId>) -> Self {
        let mut set = Self::EMPTY;
        for id in ids {
            set.insert(id);
        }
        set
    }

    pub fn insert(&mut self, id: EndpointId) {
        debug_assert!(id < MAX_ENDPOINTS);
        self.0[id >> 6] |= 1 << (id & 63);
    }

    pub fn remove(&mut self, id: EndpointId) {
        self.0[id >> 6] &= !(1 << (id & 63));
    }

    pub fn contains(&self, id: EndpointId) -> bool {
        id < MAX_ENDPOINTS && self.0[id >> 6] & (1 << (id & 63)) != 0
    }

    pub fn is_empty(&self) -> bool {
        self.0 == [0, 0]
    }

    pub fn len(&self) -> usize {
        (self.0[0].count_ones() + self.0[1].count_ones()) as usize
    }

    pub fn and(self, other: Self) -> Self {
        EndpointSet([self.0[0] & other.0[0], self.0[1] & other.0[1]])
    }

    pub fn and_not(self, other: Self) -> Self {
        EndpointSet([self.0[0] & !other.0[0], self.0[1] & !other.0[1]])
    }

    /// The ids in the set, ascending.
    pub fn iter(self) -> impl Iterator<Item = EndpointId> {
        (0..2).flat_map(move |w| {
            let mut bits = self.0[w];
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                Some(w * 64 + b)
            })
        })
    }
}

/// Precise membership: an endpoint holds a block until its engine says it removed it.
impl Membership for EndpointSet {
    fn add(&mut self, id: EndpointId, _until: Tick) {
        self.insert(id);
    }
    fn remove(&mut self, id: EndpointId) {
        EndpointSet::remove(self, id);
    }
    fn live(&self, _now: Tick) -> EndpointSet {
        *self
    }
    fn is_empty(&self) -> bool {
        EndpointSet::is_empty(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let a = EndpointSet::of([0, 5, 64, 127]);
        let b = EndpointSet::of([5, 127, 3]);
        assert_eq!(a.len(), 4);
        assert_eq!(a.and(b).iter().collect::<Vec<_>>(), vec![5, 127]);
        assert_eq!(a.and_not(b).iter().collect::<Vec<_>>(), vec![0, 64]);
        assert!(a.contains(64) && !a.contains(63) && !a.contains(500));
        let mut c = a;
        c.remove(64);
        assert!(!c.contains(64));
        assert!(EndpointSet::EMPTY.is_empty() && EndpointSet::EMPTY.iter().next().is_none());
    }
}
