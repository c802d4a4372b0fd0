//! Per endpoint: the engine's block hash → our chain hash, with the number of physical copies the
//! engine reported. Removed events name engine hashes; Stored events name the engine hash of the
//! parent block, from which the chain continues. Bounded: past `cap` entries new mappings are dropped
//! (their blocks still enter the index; only their children can no longer be placed).

use super::block_hash::BlockHash;
use super::mix_hash::MixMap;

pub struct EngineMap {
    map: MixMap<i64, (BlockHash, u32)>,
    cap: usize,
}

impl EngineMap {
    pub fn new(cap: usize) -> Self {
        EngineMap {
            map: MixMap::default(),
            cap,
        }
    }

    pub fn get(&self, engine_hash: i64) -> Option<BlockHash> {
        self.map.get(&engine_hash).map(|&(h, _)| h)
    }

    /// The engine stored one more copy of `engine_hash`, whose content hashes to `ours`.
    pub fn stored(&mut self, engine_hash: i64, ours: BlockHash) {
        if let Some(entry) = self.map.get_mut(&engine_hash) {
            entry.0 = ours;
            entry.1 += 1;
        } else if self.map.len() < self.cap {
            self.map.insert(engine_hash, (ours, 1));
        }
    }

    /// The engine dropped one copy of `engine_hash`. Returns our hash when it was the last copy, so
    /// the endpoint no longer holds the block.
    pub fn removed(&mut self, engine_hash: i64) -> Option<BlockHash> {
        let entry = self.map.get_mut(&engine_hash)?;
        entry.1 -= 1;
        if entry.1 > 0 {
            return None;
        }
        self.map.remove(&engine_hash).map(|(h, _)| h)
    }

    pub fn clear(&mut self) {
        self.map = MixMap::default();
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn memory_bytes(&self) -> usize {
        let buckets = if self.map.capacity() == 0 {
            0
        } else {
            (self.map.capacity() * 8 / 7).next_power_of_two()
        };
        buckets * (std::mem::size_of::<(i64, (BlockHash, u32))>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_counted() {
        let mut m = EngineMap::new(10);
        m.stored(7, 70);
        m.stored(7, 70);
        assert_eq!(m.removed(7), None, "one copy left");
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
