//! Byte-level BPE over raw bytes: one piece of pre-tokenized text in, token ids out.
//!
//! Merging repeatedly joins the adjacent pair of lowest rank, leftmost first. That is what both
//! `tokenizers` (merge rank = position in `merges`, checked so a stale queue entry never applies)
//! and tiktoken (rank = rank of the joined bytes) compute, so one table `(left, right) -> (rank,
//! joined)` serves both. The vocabulary is keyed by bytes, so no byte-to-unicode remapping happens
//! per piece; that mapping is only undone once, when the vocabulary is loaded.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU8, Ordering};

use super::hash::FastMap;

/// Pieces up to this many bytes merge with a quadratic scan (fastest for words); longer ones
/// (whitespace runs, long numbers, base64) with a heap.
const SCAN_LIMIT: usize = 96;

/// Token bytes → id. Tokens of up to 15 bytes (nearly all) are keyed by one `u128` holding the
/// bytes and the length, so a lookup is an integer hash and compare rather than a byte-slice hash
/// and `memcmp`.
struct Vocab {
    short: FastMap<u128, u32>,
    long: FastMap<Box<[u8]>, u32>,
}

#[inline]
fn short_key(bytes: &[u8]) -> Option<u128> {
    if bytes.len() > 15 {
        return None;
    }
    let mut key = [0u8; 16];
    key[..bytes.len()].copy_from_slice(bytes);
    key[15] = bytes.len() as u8;
    Some(u128::from_le_bytes(key))
}

impl Vocab {
    fn new(map: FastMap<Box<[u8]>, u32>) -> Self {
        let mut vocab = Vocab {
            short: FastMap::default(),
            long: FastMap::default(),
        };
        for (bytes, id) in map {
            match short_key(&bytes) {
                Some(key) => vocab.short.insert(key, id),
                None => vocab.long.insert(bytes, id),
            };
        }
        vocab
    }

    #[inline]
    fn get(&self, bytes: &[u8]) -> Option<u32> {
        match short_key(bytes) {
            Some(key) => self.short.get(&key).copied(),
            None => self.long.get(bytes).copied(),
        }
    }
}

pub struct Bpe {
    vocab: Vocab,
    merges: FastMap<u64, (u32, u32)>,
    byte_ids: [u32; 256],
    /// A piece found whole in the vocabulary is emitted as is, without merging (tiktoken; Llama 3's
    /// `ignore_merges`).
    ignore_merges: bool,
    /// Per id: 0 not yet known, 1 merging its own bytes yields just this id, 2 it does not. Lets a
    /// piece that is a vocabulary entry skip merging, which is exact once checked.
    whole: Vec<AtomicU8>,
}

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl Bpe {
    /// `vocab`: bytes of each token and its id; `merges`: pairs of ids in rank order. Every single
    /// byte must be a token (byte-level vocabularies are).
    pub fn new(
        vocab: FastMap<Box<[u8]>, u32>,
        merges: impl IntoIterator<Item = (u32, u32)>,
        ignore_merges: bool,
    ) -> Result<Self, String> {
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = *vocab
                .get(&[b as u8][..])
                .ok_or(format!("byte {b:#04x} is not in the vocabulary"))?;
        }
        let max_id = vocab.values().copied().max().unwrap_or(0) as usize;
        let mut bytes_of: Vec<&[u8]> = vec![&[]; max_id + 1];
        for (bytes, &id) in &vocab {
            bytes_of[id as usize] = bytes;
        }
        let mut table = FastMap::default();
        for (rank, (left, right)) in merges.into_iter().enumerate() {
            let (l, r) = (bytes_of.get(left as usize), bytes_of.get(right as usize));
            let (Some(l), Some(r)) = (l, r) else {
                return Err(format!("merge of unknown ids {left} {right}"));
            };
            let joined: Vec<u8> = [*l, *r].concat();
            let id = *vocab
                .get(&joined[..])
                .ok_or("a merge result is not in the vocabulary")?;
            // Later duplicates win, as when `tokenizers` collects its merge map.
            table.insert(pair_key(left, right), (rank as u32, id));
        }
        let whole = (0..=max_id).map(|_| AtomicU8::new(0)).collect();
        Ok(Bpe {
            vocab: Vocab::new(vocab),
            merges: table,
            byte_ids,
            ignore_merges,
            whole,
        })
    }

    /// A tiktoken vocabulary: tokens by rank, merges implied (a pair's rank is its join's rank).
    pub fn from_ranks(vocab: FastMap<Box<[u8]>, u32>) -> Result<Self, String> {
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = *vocab
                .get(&[b as u8][..])
                .ok_or(format!("byte {b:#04x} is not in the ranks"))?;
        }
        let mut table = FastMap::default();
        for (bytes, &rank) in &vocab {
            for split in 1..bytes.len() {
                if let (Some(&l), Some(&r)) = (vocab.get(&bytes[..split]), vocab.get(&bytes[split..])) {
                    table.insert(pair_key(l, r), (rank, rank));
                }
            }
        }
        let max_id = vocab.values().copied().max().unwrap_or(0) as usize;
        let whole = (0..=max_id).map(|_| AtomicU8::new(0)).collect();
        Ok(Bpe {
            vocab: Vocab::new(vocab),
            merges: table,
            byte_ids,
            ignore_merges: true,
            whole,
        })
    }

    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.vocab.get(bytes)
    }

    /// Append the ids of one pre-tokenized piece.
    #[inline]
    pub fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() == 1 {
            out.push(self.byte_ids[piece[0] as usize]);
            return;
        }
        if let Some(id) = self.vocab.get(piece) {
            if self.ignore_merges || self.merges_to_itself(id, piece) {
                out.push(id);
                return;
            }
        }
        self.merge(piece, out);
    }

    fn merges_to_itself(&self, id: u32, piece: &[u8]) -> bool {
        let flag = &self.whole[id as usize];
        match flag.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let mut ids = Vec::new();
                self.merge(piece, &mut ids);
                let same = ids == [id];
                flag.store(if same { 1 } else { 2 }, Ordering::Relaxed);
                same
            }
        }
    }

    #[inline]
    fn rank(&self, left: u32, right: u32) -> (u32, u32) {
        self.merges
            .get(&pair_key(left, right))
            .copied()
            .unwrap_or((u32::MAX, 0))
    }

    fn merge(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() <= SCAN_LIMIT {
            self.merge_scan(piece, out);
        } else {
            self.merge_heap(piece, out);
        }
    }

    fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        let mut ids = [0u32; SCAN_LIMIT];
        let mut ranks = [(u32::MAX, 0u32); SCAN_LIMIT];
        let mut n = piece.len();
        for (slot, &b) in ids.iter_mut().zip(piece) {
            *slot = self.byte_ids[b as usize];
        }
        for i in 0..n - 1 {
            ranks[i] = self.rank(ids[i], ids[i + 1]);
        }
        loop {
            let mut best = (u32::MAX, 0usize);
            for (i, &(rank, _)) in ranks[..n - 1].iter().enumerate() {
                if rank < best.0 {
                    best = (rank, i);
                }
            }
            if best.0 == u32::MAX {
                break;
            }
            let i = best.1;
            ids[i] = ranks[i].1;
            ids.copy_within(i + 2..n, i + 1);
            if i + 3 <= n {
                ranks.copy_within(i + 2..n - 1, i + 1);
            }
            n -= 1;
            if i + 1 < n {
                ranks[i] = self.rank(ids[i], ids[i + 1]);
            }
            if i > 0 {
                ranks[i - 1] = self.rank(ids[i - 1], ids[i]);
            }
            if n == 1 {
                break;
            }
        }
        out.extend_from_slice(&ids[..n]);
    }

    /// The same merges with a priority queue of (rank, position): O(n log n) for long pieces.
    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        let mut ids: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut alive = vec![true; n];
        let mut queue = BinaryHeap::new();
        for i in 0..n - 1 {
            let (rank, joined) = self.rank(ids[i], ids[i + 1]);
            if rank != u32::MAX {
                queue.push(Reverse((rank, i, joined)));
            }
        }
        while let Some(Reverse((_, i, joined))) = queue.pop() {
            let j = next[i];
            // Stale entries: the left symbol merged away, or either side changed since.
            if !alive[i] || j >= n || self.rank(ids[i], ids[j]).1 != joined || self.rank(ids[i], ids[j]).0 == u32::MAX {
                continue;
            }
            ids[i] = joined;
            alive[j] = false;
            next[i] = next[j];
            if next[i] < n {
                prev[next[i]] = i;
            }
            if prev[i] != usize::MAX {
                let p = prev[i];
                let (rank, joined) = self.rank(ids[p], ids[i]);
                if rank != u32::MAX {
                    queue.push(Reverse((rank, p, joined)));
                }
            }
            if next[i] < n {
                let (rank, joined) = self.rank(ids[i], ids[next[i]]);
                if rank != u32::MAX {
                    queue.push(Reverse((rank, i, joined)));
                }
            }
        }
        let mut i = 0;
        while i < n {
            out.push(ids[i]);
            i = next[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Bpe {
        // bytes a, b, c plus "ab", "bc", "abc"; "bc" outranks "ab".
        let mut vocab: FastMap<Box<[u8]>, u32> = FastMap::default();
        for b in 0..=255u8 {
            vocab.insert(Box::new([b]), u32::from(b));
        }
        vocab.insert(b"ab".to_vec().into(), 256);
        vocab.insert(b"bc".to_vec().into(), 257);
        vocab.insert(b"abc".to_vec().into(), 258);
        vocab.insert(b"aa".to_vec().into(), 259);
        let merges = [
            (u32::from(b'b'), u32::from(b'c')),
            (u32::from(b'a'), u32::from(b'b')),
            (u32::from(b'a'), 257),
            (97, 97),
        ];
        Bpe::new(vocab, merges, false).unwrap()
    }

    #[test]
    fn merges_lowest_rank_first_and_checks_whole_words() {
        let bpe = toy();
        let mut out = Vec::new();
        bpe.encode_piece(b"abc", &mut out);
        assert_eq!(out, [258]); // bc, then a+bc
        out.clear();
        bpe.encode_piece(b"ab", &mut out);
        assert_eq!(out, [256]);
        out.clear();
        bpe.encode_piece(b"aaa", &mut out);
        assert_eq!(out, [259, 97]); // leftmost pair first
    }

    #[test]
    fn heap_and_scan_agree() {
        let bpe = toy();
        let piece: Vec<u8> = b"abcaabcbcaaab".iter().cycle().take(400).copied().collect();
        let spell = |ids: &[u32]| -> Vec<u8> {
            ids.iter()
                .flat_map(|&id| match id {
                    256 => b"ab".to_vec(),
                    257 => b"bc".to_vec(),
                    258 => b"abc".to_vec(),
                    259 => b"aa".to_vec(),
                    x => vec![x as u8],
                })
                .collect()
        };
        for len in [2, 3, 10, 50, 96, 97, 200, 400] {
            let mut heap = Vec::new();
            bpe.merge_heap(&piece[..len], &mut heap);
            assert_eq!(spell(&heap), &piece[..len]);
            if len <= SCAN_LIMIT {
                let mut scan = Vec::new();
                bpe.merge_scan(&piece[..len], &mut scan);
                assert_eq!(scan, heap, "len {len}");
            }
        }
    }
}
