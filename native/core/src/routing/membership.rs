//! Who holds a block, as the index stores it per block: precise (an `EndpointSet`, from engine events)
//! or leased (`Leases`, learned from the gateway's own routing decisions and expiring after a TTL).

use super::endpoint_set::{EndpointId, EndpointSet};

/// Coarse time for leases: deciseconds since the router started (wraps after 13 years).
pub type Tick = u32;

pub trait Membership: Default + Send + Sync {
    /// `id` holds the block; a lease lasts until `until` (precise membership ignores it).
    fn add(&mut self, id: EndpointId, until: Tick);
    fn remove(&mut self, id: EndpointId);
    /// The endpoints holding the block at `now`.
    fn live(&self, now: Tick) -> EndpointSet;
    /// No endpoint is recorded at all (expired leases still count: the clock sweeps them out).
    fn is_empty(&self) -> bool;
}

const LEASES: usize = 4;
const NONE: u8 = u8::MAX;

/// Up to four (endpoint, expiry) leases per block: a prefix that the gateway spreads over more
/// endpoints than that is common enough that losing the oldest lease costs nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leases {
    ids: [u8; LEASES],
    until: [Tick; LEASES],
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            ids: [NONE; LEASES],
            until: [0; LEASES],
        }
    }
}

impl Membership for Leases {
    fn add(&mut self, id: EndpointId, until: Tick) {
        let id = id as u8;
        let slot = self
            .ids
            .iter()
            .position(|&x| x == id)
            .or_else(|| self.ids.iter().position(|&x| x == NONE))
            // Replace the lease that expires first.
            .unwrap_or_else(|| (0..LEASES).min_by_key(|&i| self.until[i]).unwrap_or(0));
        self.ids[slot] = id;
        self.until[slot] = until;
    }

    fn remove(&mut self, id: EndpointId) {
        for i in 0..LEASES {
            if self.ids[i] == id as u8 {
                self.ids[i] = NONE;
                self.until[i] = 0;
            }
        }
    }

    fn live(&self, now: Tick) -> EndpointSet {
        let mut set = EndpointSet::EMPTY;
        for i in 0..LEASES {
            if self.ids[i] != NONE && self.until[i] > now {
                set.insert(self.ids[i] as EndpointId);
            }
        }
        set
    }

    fn is_empty(&self) -> bool {
        self.ids == [NONE; LEASES]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_expire() {
        let mut l = Leases::default();
        l.add(3, 100);
        l.add(7, 50);
        assert_eq!(l.live(10), EndpointSet::of([3, 7]));
        assert_eq!(l.live(50), EndpointSet::of([3]));
        assert_eq!(l.live(100), EndpointSet::EMPTY);
        assert!(!l.is_empty(), "expired leases stay until swept");
    }

    #[test]
    fn renewing_a_lease_moves_its_expiry() {
        let mut l = Leases::default();
        l.add(3, 100);
        l.add(3, 300);
        assert_eq!(l.live(200), EndpointSet::of([3]));
        l.add(3, 150);
        assert_eq!(
            l.live(200),
            EndpointSet::EMPTY,
            "the latest routing decision sets the expiry"
        );
    }

    #[test]
    fn a_fifth_endpoint_replaces_the_lease_expiring_first() {
        let mut l = Leases::default();
        for (id, until) in [(0, 40), (1, 10), (2, 30), (3, 20)] {
            l.add(id, until);
        }
        l.add(4, 50);
        assert_eq!(l.live(0), EndpointSet::of([0, 2, 3, 4]));
        l.remove(2);
        assert_eq!(l.live(0), EndpointSet::of([0, 3, 4]));
    }
}
