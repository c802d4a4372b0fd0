//! The precise index's holders of one block: up to three endpoint ids inline in the block's slot (a block
//! is typically held by one to three engines), spilling to a sorted vector in the shard's arena once more
//! engines hold it, and back inline when they drop it. Seven bytes, so that a slot (hash, holders,
//! reference flag) is 16 whatever the endpoint count.
//!
//! Each spilled set keeps a fingerprint beside it (`SetPrint`, kept current on every change) so that a
//! match asking "are this block's holders exactly the endpoints still matching?" (block after block
//! of a shared prefix, `PrefixIndex::match_prefix_where`) reads 16 bytes instead of the whole set: at
//! 10,000 endpoints a shared prefix is held by ~150 of them, five cache lines per block.

use super::endpoint_set::EndpointId;
use super::membership::{Membership, Tick};
use super::mix_hash::mix64;

const INLINE: usize = 3;
/// `tag` of a spilled set: `bytes[..4]` is its index in the arena.
const SPILLED: u8 = u8::MAX;

/// Ids ascending: `tag` inline ids in `bytes` (little-endian `u16`s), or a spilled set.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Holders {
    bytes: [u8; 6],
    tag: u8,
}

/// A set of endpoint ids in 16 bytes: its size and the wrapping sum of its ids' mixes. Two different
/// sets agree on both with probability about 2^-64, the same bet the index already makes by naming
/// blocks with 64-bit hashes.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct SetPrint {
    sum: u64,
    len: u64,
}

impl SetPrint {
    /// The print of `ids` (any order).
    pub fn of(ids: impl IntoIterator<Item = EndpointId>) -> SetPrint {
        let mut print = SetPrint::default();
        for id in ids {
            print.add(id);
        }
        print
    }

    fn add(&mut self, id: EndpointId) {
        // mix64 is a bijection with mix64(0) = 0: the +1 gives id 0 a share too.
        self.sum = self.sum.wrapping_add(mix64(id as u64 + 1));
        self.len += 1;
    }

    fn remove(&mut self, id: EndpointId) {
        self.sum = self.sum.wrapping_sub(mix64(id as u64 + 1));
        self.len -= 1;
    }
}

/// A shard's spilled holder sets (each sorted, more than `INLINE` ids), their prints (same places) and
/// the free places among them.
#[derive(Default)]
pub struct HolderSpill {
    sets: Vec<Vec<u16>>,
    prints: Vec<SetPrint>,
    free: Vec<u32>,
}

impl HolderSpill {
    fn alloc(&mut self, ids: Vec<u16>) -> u32 {
        let print = SetPrint::of(ids.iter().map(|&id| EndpointId::from(id)));
        match self.free.pop() {
            Some(i) => {
                self.sets[i as usize] = ids;
                self.prints[i as usize] = print;
                i
            }
            None => {
                self.sets.push(ids);
                self.prints.push(print);
                (self.sets.len() - 1) as u32
            }
        }
    }

    fn take(&mut self, i: u32) -> Vec<u16> {
        self.free.push(i);
        self.prints[i as usize] = SetPrint::default();
        std::mem::take(&mut self.sets[i as usize])
    }
}

impl Holders {
    fn inline(&self) -> ([u16; INLINE], usize) {
        let mut ids = [0; INLINE];
        for (k, id) in ids.iter_mut().enumerate() {
            *id = u16::from_le_bytes([self.bytes[2 * k], self.bytes[2 * k + 1]]);
        }
        (ids, usize::from(self.tag))
    }

    fn set_inline(&mut self, ids: &[u16]) {
        debug_assert!(ids.len() <= INLINE);
        self.bytes = [0; 6];
        for (k, id) in ids.iter().enumerate() {
            self.bytes[2 * k..2 * k + 2].copy_from_slice(&id.to_le_bytes());
        }
        self.tag = ids.len() as u8;
    }

    fn spill_index(&self) -> Option<u32> {
        (self.tag == SPILLED).then(|| u32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]]))
    }

    /// The ids, ascending.
    pub fn ids<'a>(&self, spill: &'a HolderSpill) -> HolderIds<'a> {
        match self.spill_index() {
            Some(i) => HolderIds::Spilled(&spill.sets[i as usize]),
            None => {
                let (ids, n) = self.inline();
                HolderIds::Inline(ids, n)
            }
        }
    }
}

/// A block's holder ids, borrowed.
pub enum HolderIds<'a> {
    Inline([u16; INLINE], usize),
    Spilled(&'a [u16]),
}

impl HolderIds<'_> {
    pub fn as_slice(&self) -> &[u16] {
        match self {
            HolderIds::Inline(ids, n) => &ids[..*n],
            HolderIds::Spilled(ids) => ids,
        }
    }
}

/// Precise membership: an endpoint holds a block until its engine says it removed it.
impl Membership for Holders {
    type Spill = HolderSpill;

    fn add(&mut self, id: EndpointId, _until: Tick, spill: &mut HolderSpill) {
        let id = id as u16;
        if let Some(i) = self.spill_index() {
            let set = &mut spill.sets[i as usize];
            if let Err(p) = set.binary_search(&id) {
                set.insert(p, id);
                spill.prints[i as usize].add(EndpointId::from(id));
            }
            return;
        }
        let (ids, n) = self.inline();
        let Err(p) = ids[..n].binary_search(&id) else {
            return;
        };
        let mut grown = Vec::with_capacity(if n < INLINE { INLINE } else { 2 * INLINE + 2 });
        grown.extend_from_slice(&ids[..p]);
        grown.push(id);
        grown.extend_from_slice(&ids[p..n]);
        if grown.len() <= INLINE {
            self.set_inline(&grown);
        } else {
            let i = spill.alloc(grown);
            self.bytes = [0; 6];
            self.bytes[..4].copy_from_slice(&i.to_le_bytes());
            self.tag = SPILLED;
        }
    }

    fn remove(&mut self, id: EndpointId, spill: &mut HolderSpill) {
        let Ok(id) = u16::try_from(id) else {
            return;
        };
        if let Some(i) = self.spill_index() {
            let set = &mut spill.sets[i as usize];
            if let Ok(p) = set.binary_search(&id) {
                set.remove(p);
                spill.prints[i as usize].remove(EndpointId::from(id));
            }
            if set.len() <= INLINE {
                let set = spill.take(i);
                self.set_inline(&set);
            }
            return;
        }
        let (ids, n) = self.inline();
        if let Ok(p) = ids[..n].binary_search(&id) {
            let mut kept = [0; INLINE];
            kept[..p].copy_from_slice(&ids[..p]);
            kept[p..n - 1].copy_from_slice(&ids[p + 1..n]);
            self.set_inline(&kept[..n - 1]);
        }
    }

    fn release(&mut self, spill: &mut HolderSpill) {
        if let Some(i) = self.spill_index() {
            spill.take(i);
        }
        *self = Holders::default();
    }

    fn live_into(&self, _now: Tick, spill: &HolderSpill, out: &mut Vec<EndpointId>) {
        out.extend(self.ids(spill).as_slice().iter().map(|&id| EndpointId::from(id)));
    }

    fn warm(&self, spill: &HolderSpill) {
        if let Some(i) = self.spill_index() {
            std::hint::black_box(spill.prints[i as usize]);
        }
    }

    /// A spilled set by its print, an inline one in place: a prompt's shared prefix is usually held
    /// whole by the same endpoints, block after block.
    fn holders_are(&self, ids: &[EndpointId], print: SetPrint, _now: Tick, spill: &HolderSpill) -> bool {
        if let Some(i) = self.spill_index() {
            return spill.prints[i as usize] == print;
        }
        let (held, n) = self.inline();
        n == ids.len() && held[..n].iter().zip(ids).all(|(&h, &id)| EndpointId::from(h) == id)
    }

    fn holds(&self, id: EndpointId, _now: Tick, spill: &HolderSpill) -> bool {
        u16::try_from(id).is_ok_and(|id| self.ids(spill).as_slice().binary_search(&id).is_ok())
    }

    fn is_empty(&self) -> bool {
        self.tag == 0
    }

    fn spill_bytes(spill: &HolderSpill) -> usize {
        spill.sets.capacity() * std::mem::size_of::<Vec<u16>>()
            + spill.sets.iter().map(|s| s.capacity() * 2).sum::<usize>()
            + spill.prints.capacity() * std::mem::size_of::<SetPrint>()
            + spill.free.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(h: &Holders, spill: &HolderSpill) -> Vec<EndpointId> {
        let mut out = Vec::new();
        h.live_into(0, spill, &mut out);
        out
    }

    #[test]
    fn seven_bytes() {
        assert_eq!(std::mem::size_of::<Holders>(), 7);
    }

    #[test]
    fn spills_past_three_and_comes_back() {
        let mut spill = HolderSpill::default();
        let mut h = Holders::default();
        for id in [9_999, 3, 200, 3] {
            h.add(id, 0, &mut spill);
        }
        assert_eq!(ids(&h, &spill), vec![3, 200, 9_999]);
        assert_eq!(spill.sets.len(), 0, "three fit inline");
        h.add(65_534, 0, &mut spill);
        h.add(0, 0, &mut spill);
        assert_eq!(ids(&h, &spill), vec![0, 3, 200, 9_999, 65_534]);
        assert!(h.holds(65_534, 0, &spill) && !h.holds(4, 0, &spill) && !h.holds(1 << 20, 0, &spill));
        h.remove(200, &mut spill);
        assert_eq!(ids(&h, &spill), vec![0, 3, 9_999, 65_534]);
        h.remove(0, &mut spill);
        assert_eq!(ids(&h, &spill), vec![3, 9_999, 65_534]);
        assert_eq!(spill.free, vec![0], "back inline, its spilled set freed");
        for id in [3, 9_999, 65_534, 77] {
            h.remove(id, &mut spill);
        }
        assert!(h.is_empty());
    }

    #[test]
    fn a_spilled_sets_print_follows_every_change() {
        let mut spill = HolderSpill::default();
        let mut h = Holders::default();
        let is = |h: &Holders, spill: &HolderSpill, ids: &[EndpointId]| {
            h.holders_are(ids, SetPrint::of(ids.iter().copied()), 0, spill)
        };
        for id in [40, 7, 9_000, 12, 7] {
            h.add(id, 0, &mut spill);
        }
        assert!(is(&h, &spill, &[7, 12, 40, 9_000]));
        assert!(!is(&h, &spill, &[7, 12, 40, 9_001]), "same size, one id differs");
        assert!(!is(&h, &spill, &[7, 12, 40]), "a subset");
        assert!(!is(&h, &spill, &[7, 12, 40, 9_000, 9_001]), "a superset");
        h.add(0, 0, &mut spill);
        assert!(is(&h, &spill, &[0, 7, 12, 40, 9_000]), "id 0 counts");
        h.remove(40, &mut spill);
        h.remove(40, &mut spill);
        assert!(is(&h, &spill, &[0, 7, 12, 9_000]), "a second removal changes nothing");
        h.remove(0, &mut spill);
        assert!(is(&h, &spill, &[7, 12, 9_000]), "back inline");
        assert!(!is(&h, &spill, &[7, 12, 9_001]));
        let mut other = Holders::default();
        for id in [1, 2, 3, 4] {
            other.add(id, 0, &mut spill);
        }
        assert_eq!(spill.sets.len(), 1, "the freed place is reused");
        assert!(
            is(&other, &spill, &[1, 2, 3, 4]),
            "a reused place starts from its own ids"
        );
    }

    #[test]
    fn release_frees_the_spilled_set() {
        let mut spill = HolderSpill::default();
        let mut a = Holders::default();
        for id in 0..10_000 {
            a.add(id, 0, &mut spill);
        }
        assert_eq!(ids(&a, &spill).len(), 10_000);
        a.release(&mut spill);
        assert!(a.is_empty());
        let mut b = Holders::default();
        for id in 0..5 {
            b.add(id, 0, &mut spill);
        }
        assert_eq!(spill.sets.len(), 1, "the freed place is reused");
        assert_eq!(ids(&b, &spill), vec![0, 1, 2, 3, 4]);
    }
}
