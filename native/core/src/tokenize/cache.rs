//! The token cache: L0 exact prompt text → ids, L1 longest cached prefix ending at an added token.
//!
//! One LRU of prompt records (text, ids, and for each added-token boundary the prefix hash and how
//! many ids precede it), bounded by count and bytes, with two indexes: full-text hash → record (L0)
//! and prefix hash → (record, boundary) (L1). A hit is only used after comparing the text itself,
//! so hash collisions cannot change a result. Tokenizing the text before an added token and the text
//! after it separately gives the same ids as tokenizing the whole (added tokens are split out first
//! and each stretch between them is tokenized on its own), which is what makes L1 exact: a
//! conversation re-sent with one more turn only tokenizes the new turn.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::hash::HashedMap;

const NONE: u32 = u32::MAX;
/// Per-record bookkeeping counted against the byte budget besides text and ids.
const RECORD_OVERHEAD: usize = 96;

/// A boundary of a prompt: the text up to `end` (bytes) tokenizes to the first `ids` ids.
#[derive(Clone, Copy, Debug)]
pub struct Boundary {
    pub hash: u64,
    pub end: usize,
    pub ids: usize,
}

struct Record {
    text: Arc<str>,
    ids: Arc<[u32]>,
    hash: u64,
    boundaries: Vec<Boundary>,
    generation: u32,
    prev: u32,
    next: u32,
}

impl Record {
    fn bytes(&self) -> usize {
        self.text.len() + 4 * self.ids.len() + 24 * self.boundaries.len() + RECORD_OVERHEAD
    }
}

#[derive(Default)]
struct Lru {
    slots: Vec<Option<Record>>,
    free: Vec<u32>,
    /// Most recently used first.
    head: u32,
    tail: u32,
    len: usize,
    bytes: usize,
    generations: u32,
    exact: HashedMap<(u32, u32)>,
    prefix: HashedMap<(u32, u32, u32)>,
}

/// What the cache did so far; counters only grow (`clear` keeps them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CacheStats {
    pub l0_hits: u64,
    pub l0_misses: u64,
    pub l1_hits: u64,
    pub l1_misses: u64,
    /// Ids taken from L1 prefixes instead of being computed.
    pub l1_reused_ids: u64,
    /// Text actually run through the tokenizer (after the caches), in bytes.
    pub tokenized_bytes: u64,
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    l0_hits: AtomicU64,
    l0_misses: AtomicU64,
    l1_hits: AtomicU64,
    l1_misses: AtomicU64,
    l1_reused_ids: AtomicU64,
    tokenized_bytes: AtomicU64,
}

pub struct TokenCache {
    lru: Mutex<Lru>,
    counters: Counters,
    limits: Mutex<(usize, usize)>,
}

/// A usable L1 hit: the first `ids` ids of `record_ids` are the query's text up to `end`.
pub struct PrefixHit {
    pub end: usize,
    pub ids: Arc<[u32]>,
    pub count: usize,
}

impl TokenCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        let lru = Lru {
            head: NONE,
            tail: NONE,
            ..Default::default()
        };
        TokenCache {
            lru: Mutex::new(lru),
            counters: Counters::default(),
            limits: Mutex::new((max_entries, max_bytes)),
        }
    }

    fn enabled(&self) -> bool {
        let (entries, bytes) = *self.limits.lock().expect("cache limits");
        entries > 0 && bytes > 0
    }

    /// L0: the ids of exactly `text`.
    pub fn get_exact(&self, text: &str, hash: u64) -> Option<Arc<[u32]>> {
        if !self.enabled() {
            return None;
        }
        let mut lru = self.lru.lock().expect("token cache");
        let hit = lru.exact.get(&hash).copied().filter(|&(slot, generation)| {
            lru.record(slot)
                .is_some_and(|r| r.generation == generation && *r.text == *text)
        });
        let result = hit.map(|(slot, _)| {
            lru.touch(slot);
            lru.record(slot).expect("live").ids.clone()
        });
        drop(lru);
        let counter = if result.is_some() {
            &self.counters.l0_hits
        } else {
            &self.counters.l0_misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// L1: the last of `boundaries` (the query's own, in text order) whose prefix is cached.
    pub fn longest_prefix(&self, text: &str, boundaries: &[Boundary]) -> Option<PrefixHit> {
        if !self.enabled() || boundaries.is_empty() {
            return None;
        }
        let mut lru = self.lru.lock().expect("token cache");
        let mut found = None;
        for b in boundaries.iter().rev() {
            let Some(&(slot, generation, index)) = lru.prefix.get(&b.hash) else {
                continue;
            };
            let Some(record) = lru.record(slot).filter(|r| r.generation == generation) else {
                continue;
            };
            let cached = record.boundaries[index as usize];
            if cached.end == b.end && record.text.as_bytes()[..b.end] == text.as_bytes()[..b.end] {
                found = Some((
                    slot,
                    PrefixHit {
                        end: b.end,
                        ids: record.ids.clone(),
                        count: cached.ids,
                    },
                ));
                break;
            }
        }
        if let Some((slot, _)) = &found {
            lru.touch(*slot);
        }
        drop(lru);
        match &found {
            Some((_, hit)) => {
                self.counters.l1_hits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .l1_reused_ids
                    .fetch_add(hit.count as u64, Ordering::Relaxed);
            }
            None => {
                self.counters.l1_misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        found.map(|(_, hit)| hit)
    }

    pub fn count_tokenized(&self, bytes: usize) {
        self.counters.tokenized_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Remember a prompt; its boundaries become L1 entries (replacing older ones with equal prefix).
    pub fn insert(&self, text: Arc<str>, ids: Arc<[u32]>, hash: u64, boundaries: Vec<Boundary>) {
        let (max_entries, max_bytes) = *self.limits.lock().expect("cache limits");
        let record = Record {
            text,
            ids,
            hash,
            boundaries,
            generation: 0,
            prev: NONE,
            next: NONE,
        };
        if max_entries == 0 || record.bytes() > max_bytes {
            return;
        }
        let mut lru = self.lru.lock().expect("token cache");
        if let Some(&(slot, generation)) = lru.exact.get(&hash) {
            if lru
                .record(slot)
                .is_some_and(|r| r.generation == generation && r.text == record.text)
            {
                return; // another thread got there first
            }
        }
        lru.push_front(record);
        while lru.len > max_entries || lru.bytes > max_bytes {
            lru.evict_last();
        }
    }

    pub fn clear(&self) {
        let mut lru = self.lru.lock().expect("token cache");
        *lru = Lru {
            head: NONE,
            tail: NONE,
            generations: lru.generations,
            ..Default::default()
        };
    }

    pub fn set_limits(&self, max_entries: usize, max_bytes: usize) {
        *self.limits.lock().expect("cache limits") = (max_entries, max_bytes);
        let mut lru = self.lru.lock().expect("token cache");
        while lru.len > 0 && (lru.len > max_entries || lru.bytes > max_bytes) {
            lru.evict_last();
        }
    }

    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let lru = self.lru.lock().expect("token cache");
        CacheStats {
            l0_hits: c.l0_hits.load(Ordering::Relaxed),
            l0_misses: c.l0_misses.load(Ordering::Relaxed),
            l1_hits: c.l1_hits.load(Ordering::Relaxed),
            l1_misses: c.l1_misses.load(Ordering::Relaxed),
            l1_reused_ids: c.l1_reused_ids.load(Ordering::Relaxed),
            tokenized_bytes: c.tokenized_bytes.load(Ordering::Relaxed),
            entries: lru.len as u64,
            bytes: lru.bytes as u64,
        }
    }
}

impl Lru {
    fn record(&self, slot: u32) -> Option<&Record> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    fn record_mut(&mut self, slot: u32) -> &mut Record {
        self.slots[slot as usize].as_mut().expect("live record")
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let r = self.record_mut(slot);
            (r.prev, r.next)
        };
        if prev == NONE {
            self.head = next;
        } else {
            self.record_mut(prev).next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.record_mut(next).prev = prev;
        }
    }

    fn link_front(&mut self, slot: u32) {
        let head = self.head;
        {
            let r = self.record_mut(slot);
            r.prev = NONE;
            r.next = head;
        }
        if head != NONE {
            self.record_mut(head).prev = slot;
        } else {
            self.tail = slot;
        }
        self.head = slot;
    }

    fn touch(&mut self, slot: u32) {
        if self.head != slot {
            self.unlink(slot);
            self.link_front(slot);
        }
    }

    fn push_front(&mut self, mut record: Record) {
        self.generations = self.generations.wrapping_add(1);
        record.generation = self.generations;
        let generation = record.generation;
        self.bytes += record.bytes();
        self.len += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(record);
                slot
            }
            None => {
                self.slots.push(Some(record));
                (self.slots.len() - 1) as u32
            }
        };
        self.link_front(slot);
        let r = self.record(slot).expect("just stored");
        let hash = r.hash;
        let hashes: Vec<u64> = r.boundaries.iter().map(|b| b.hash).collect();
        self.exact.insert(hash, (slot, generation));
        for (index, h) in hashes.into_iter().enumerate() {
            self.prefix.insert(h, (slot, generation, index as u32));
        }
    }

    fn evict_last(&mut self) {
        let slot = self.tail;
        if slot == NONE {
            return;
        }
        self.unlink(slot);
        let record = self.slots[slot as usize].take().expect("live record");
        self.free.push(slot);
        self.len -= 1;
        self.bytes -= record.bytes();
        if self
            .exact
            .get(&record.hash)
            .is_some_and(|&(s, g)| s == slot && g == record.generation)
        {
            self.exact.remove(&record.hash);
        }
        for b in &record.boundaries {
            if self
                .prefix
                .get(&b.hash)
                .is_some_and(|&(s, g, _)| s == slot && g == record.generation)
            {
                self.prefix.remove(&b.hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Arc<[u32]> {
        (0..n).collect::<Vec<_>>().into()
    }

    #[test]
    fn lru_evicts_least_recently_used_and_keeps_indexes_consistent() {
        let cache = TokenCache::new(2, 1 << 20);
        for (i, text) in ["a", "b", "c"].into_iter().enumerate() {
            let b = vec![Boundary {
                hash: 100 + i as u64,
                end: 1,
                ids: 1,
            }];
            cache.insert(text.into(), ids(1), i as u64, b);
            if text == "b" {
                assert!(cache.get_exact("a", 0).is_some()); // "a" becomes most recent
            }
        }
        // "b" was least recently used when "c" arrived.
        assert!(cache.get_exact("a", 0).is_some());
        assert!(cache.get_exact("b", 1).is_none());
        assert!(cache.get_exact("c", 2).is_some());
        assert!(cache
            .longest_prefix(
                "b",
                &[Boundary {
                    hash: 101,
                    end: 1,
                    ids: 0
                }]
            )
            .is_none());
        let hit = cache
            .longest_prefix(
                "c",
                &[Boundary {
                    hash: 102,
                    end: 1,
                    ids: 0,
                }],
            )
            .unwrap();
        assert_eq!((hit.end, hit.count), (1, 1));
        let s = cache.stats();
        assert_eq!(
            (s.entries, s.l0_hits, s.l0_misses, s.l1_hits, s.l1_misses),
            (2, 3, 1, 1, 1)
        );
    }

    #[test]
    fn a_colliding_hash_is_not_a_hit() {
        let cache = TokenCache::new(8, 1 << 20);
        cache.insert(
            "hello".into(),
            ids(2),
            7,
            vec![Boundary {
                hash: 9,
                end: 3,
                ids: 1,
            }],
        );
        assert!(cache.get_exact("world", 7).is_none());
        assert!(cache
            .longest_prefix(
                "abcd",
                &[Boundary {
                    hash: 9,
                    end: 3,
                    ids: 0
                }]
            )
            .is_none());
        assert!(cache
            .longest_prefix(
                "hel",
                &[Boundary {
                    hash: 9,
                    end: 3,
                    ids: 0
                }]
            )
            .is_some());
    }

    #[test]
    fn byte_budget_bounds_the_cache() {
        let cache = TokenCache::new(1000, 3 * (1000 + 4000 + RECORD_OVERHEAD));
        for i in 0..10u64 {
            let text: String = std::iter::repeat_n('x', 1000).collect::<String>() + &i.to_string();
            cache.insert(text.into(), ids(1000), i, vec![]);
        }
        assert!(cache.stats().entries <= 3);
    }
}
