//! Endpoint ids and a set of them as a growable bitset: the candidates a prefix match is restricted to,
//! and the router's retired ids. A block's holders are kept more compactly (`holders.rs`).

/// Endpoint ids are `0..MAX_ENDPOINTS`, assigned by the router (one router per served model); the
/// index stores them as `u16` (`u16::MAX` marks an empty lease).
pub const MAX_ENDPOINTS: usize = u16::MAX as usize;

pub type EndpointId = usize;

#[derive(Clone, Default, PartialEq, Eq, Debug)]
pub struct EndpointSet(Vec<u64>);

impl EndpointSet {
    pub fn of(ids: impl IntoIterator<Item = EndpointId>) -> Self {
        let mut set = Self::default();
        for id in ids {
            set.insert(id);
        }
        set
    }

    /// An empty set with room for ids below `n` without growing.
    pub fn with_capacity(n: usize) -> Self {
        EndpointSet(vec![0; n.div_ceil(64)])
    }

    pub fn insert(&mut self, id: EndpointId) {
        debug_assert!(id < MAX_ENDPOINTS);
        let w = id >> 6;
        if w >= self.0.len() {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (id & 63);
    }

    pub fn remove(&mut self, id: EndpointId) {
        if let Some(w) = self.0.get_mut(id >> 6) {
            *w &= !(1 << (id & 63));
        }
    }

    pub fn contains(&self, id: EndpointId) -> bool {
        self.0.get(id >> 6).is_some_and(|w| w & (1 << (id & 63)) != 0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The ids in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = EndpointId> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let a = EndpointSet::of([0, 5, 64, 127, 9_999]);
        assert_eq!(a.len(), 5);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 5, 64, 127, 9_999]);
        assert!(a.contains(64) && a.contains(9_999) && !a.contains(63) && !a.contains(500));
        assert!(!a.contains(1 << 20), "past the last word");
        let mut c = a.clone();
        c.remove(64);
        c.remove(1 << 20);
        assert!(!c.contains(64) && c.len() == 4);
        assert!(EndpointSet::default().is_empty() && EndpointSet::default().iter().next().is_none());
        assert!(EndpointSet::with_capacity(300).is_empty());
    }
}
