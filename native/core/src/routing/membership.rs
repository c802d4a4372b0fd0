//! Who holds a block, as the index stores it per block: precise (`Holders` in `holders.rs`, from engine
//! events) or leased (`Leases`, learned from the gateway's own routing decisions and expiring after a
//! TTL).

use super::endpoint_set::EndpointId;
use super::holders::SetPrint;

/// Coarse time for leases: deciseconds since the router started (wraps after 13 years).
pub type Tick = u32;

pub trait Membership: Default + Send + Sync {
    /// Storage a shard keeps for the sets that outgrow their block's slot (`()` when none do).
    type Spill: Default + Send + Sync;
    /// `id` holds the block; a lease lasts until `until` (precise membership ignores it).
    fn add(&mut self, id: EndpointId, until: Tick, spill: &mut Self::Spill);
    fn remove(&mut self, id: EndpointId, spill: &mut Self::Spill);
    /// Empties the set, returning what it kept in `spill`.
    fn release(&mut self, spill: &mut Self::Spill);
    /// Appends the endpoints holding the block at `now` to `out`, ascending.
    fn live_into(&self, now: Tick, spill: &Self::Spill, out: &mut Vec<EndpointId>);
    /// Whether `id` holds the block at `now`.
    fn holds(&self, id: EndpointId, now: Tick, spill: &Self::Spill) -> bool;
    /// Reads what a match reads first of the block's holders (a spilled set, `holders.rs`), so that a
    /// batch of lookups waits for their cache misses together (`PrefixIndex::match_prefix_where`).
    fn warm(&self, _spill: &Self::Spill) {}
    /// Whether the endpoints holding the block at `now` are exactly `ids` (ascending; `print` is
    /// `SetPrint::of(ids)`, for a membership that keeps prints).
    fn holders_are(&self, ids: &[EndpointId], _print: SetPrint, now: Tick, spill: &Self::Spill) -> bool {
        let mut live = Vec::with_capacity(ids.len());
        self.live_into(now, spill, &mut live);
        live == ids
    }
    /// No endpoint is recorded at all (expired leases still count: the clock sweeps them out).
    fn is_empty(&self) -> bool;
    /// Bytes `spill` holds.
    fn spill_bytes(spill: &Self::Spill) -> usize;
}

const LEASES: usize = 4;
const NONE: u16 = u16::MAX;

/// Up to four (endpoint, expiry) leases per block: a prefix that the gateway spreads over more
/// endpoints than that is common enough that losing the oldest lease costs nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leases {
    ids: [u16; LEASES],
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

impl Leases {
    fn live(&self, now: Tick) -> impl Iterator<Item = EndpointId> + '_ {
        (0..LEASES)
            .filter(move |&i| self.ids[i] != NONE && self.until[i] > now)
            .map(|i| EndpointId::from(self.ids[i]))
    }
}

impl Membership for Leases {
    type Spill = ();

    fn add(&mut self, id: EndpointId, until: Tick, _: &mut ()) {
        let id = id as u16;
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

    fn remove(&mut self, id: EndpointId, _: &mut ()) {
        for i in 0..LEASES {
            if EndpointId::from(self.ids[i]) == id {
                self.ids[i] = NONE;
                self.until[i] = 0;
            }
        }
    }

    fn release(&mut self, _: &mut ()) {
        *self = Leases::default();
    }

    fn live_into(&self, now: Tick, _: &(), out: &mut Vec<EndpointId>) {
        let start = out.len();
        out.extend(self.live(now));
        out[start..].sort_unstable();
    }

    fn holds(&self, id: EndpointId, now: Tick, _: &()) -> bool {
        self.live(now).any(|x| x == id)
    }

    fn is_empty(&self) -> bool {
        self.ids == [NONE; LEASES]
    }

    fn spill_bytes(_: &()) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(l: &Leases, now: Tick) -> Vec<EndpointId> {
        let mut out = Vec::new();
        l.live_into(now, &(), &mut out);
        out
    }

    #[test]
    fn leases_expire() {
        let mut l = Leases::default();
        l.add(3, 100, &mut ());
        l.add(7, 50, &mut ());
        assert_eq!(live(&l, 10), vec![3, 7]);
        assert_eq!(live(&l, 50), vec![3]);
        assert_eq!(live(&l, 100), Vec::<EndpointId>::new());
        assert!(!l.is_empty(), "expired leases stay until swept");
    }

    #[test]
    fn renewing_a_lease_moves_its_expiry() {
        let mut l = Leases::default();
        l.add(3, 100, &mut ());
        l.add(3, 300, &mut ());
        assert_eq!(live(&l, 200), vec![3]);
        l.add(3, 150, &mut ());
        assert_eq!(
            live(&l, 200),
            Vec::<EndpointId>::new(),
            "the latest routing decision sets the expiry"
        );
    }

    #[test]
    fn a_fifth_endpoint_replaces_the_lease_expiring_first() {
        let mut l = Leases::default();
        for (id, until) in [(0, 40), (1, 10), (2, 30), (3, 20)] {
            l.add(id, until, &mut ());
        }
        l.add(4_465, 50, &mut ());
        assert_eq!(live(&l, 0), vec![0, 2, 3, 4465]);
        l.remove(2, &mut ());
        assert_eq!(live(&l, 0), vec![0, 3, 4465]);
    }
}
