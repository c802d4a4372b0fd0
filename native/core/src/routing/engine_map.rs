//! Per endpoint: the engine's block hash → our chain hash, with the number of physical copies the
//! engine reported. Removed events name engine hashes; Stored events name the engine hash of the
//! parent block, from which the chain continues. Bounded: past `cap` entries new mappings are dropped
//! (their blocks still enter the index; only their children can no longer be placed). A block is nearly
//! always stored once: the count of further copies lives in a second map, so that an entry is 16 bytes.

use super::block_hash::BlockHash;
use super::mix_hash::MixMap;

pub struct EngineMap {
    map: MixMap<i64, BlockHash>,
    /// Copies beyond the first, for the engine hashes stored more than once.
    extra: MixMap<i64, u32>,
    cap: usize,
}

impl EngineMap {
    pub fn new(cap: usize) -> Self {
        EngineMap {
            map: MixMap::default(),
            extra: MixMap::default(),
            cap,
        }
    }

    pub fn get(&self, engine_hash: i64) -> Option<BlockHash> {
        self.map.get(&engine_hash).copied()
    }

    /// The engine stored one more copy of `engine_hash`, whose content hashes to `ours`.
    pub fn stored(&mut self, engine_hash: i64, ours: BlockHash) {
        if let Some(entry) = self.map.get_mut(&engine_hash) {
            *entry = ours;
            *self.extra.entry(engine_hash).or_default() += 1;
        } else if self.map.len() < self.cap {
            self.map.insert(engine_hash, ours);
        }
    }

    /// The engine dropped one copy of `engine_hash`. Returns our hash when it was the last copy, so
    /// the endpoint no longer holds the block.
    pub fn removed(&mut self, engine_hash: i64) -> Option<BlockHash> {
        if let Some(extra) = self.extra.get_mut(&engine_hash) {
            *extra -= 1;
            if *extra == 0 {
                self.extra.remove(&engine_hash);
            }
            return None;
        }
        self.map.remove(&engine_hash)
    }

    pub fn clear(&mut self) {
        self.map = MixMap::default();
        self.extra = MixMap::default();
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn memory_bytes(&self) -> usize {
        table_bytes(self.map.capacity(), std::mem::size_of::<(i64, BlockHash)>())
            + table_bytes(self.extra.capacity(), std::mem::size_of::<(i64, u32)>())
    }
}

/// Bytes of a hashbrown table of `capacity` entries of `entry` bytes: one control byte per bucket,
/// buckets a power of two at most 8/7 of the capacity.
fn table_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    (capacity * 8 / 7).next_power_of_two() * (entry + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_counted() {
        let mut m = EngineMap::new(10);
        m.stored(7, 70);
        m.stored(7, 70);
        m.stored(7, 70);
        assert_eq!(m.removed(7), None, "two copies left");
        assert_eq!(m.removed(7), None, "one copy left");
        assert_eq!(m.get(7), Some(70));
        assert_eq!(m.removed(7), Some(70));
        assert_eq!(m.removed(7), None, "unknown hash");
        assert!(m.is_empty());
    }

    #[test]
    fn bounded() {
        let mut m = EngineMap::new(2);
        for h in 0..5 {
            m.stored(h, h as u64);
        }
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(4), None);
    }
}
