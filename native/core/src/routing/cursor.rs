//! The sequence cursor of one endpoint's KV-event stream: admits each batch exactly once, in order,
//! and reports a gap so the caller resynchronizes (clear, resubscribe from 0).
//!
//! States: `Fresh` (after a reset: the first batch of a subscription from 0 may carry any number),
//! `Live { last }` (expects `last + 1`), `Broken` (a gap was seen; nothing is admitted until a reset).
//! `load_only` batches repeat the last number sent and are admitted for their load only; one numbered
//! past `last` means batches were lost. Snapshot chunks must arrive in order, starting at chunk 0.

use crate::pb::kv_events::KvSnapshotChunk;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cursor {
    Fresh,
    Live { last: u64, next_chunk: Option<u32> },
    Broken { expected: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Apply,
    LoadOnly,
    Duplicate,
    Gap { expected: u64, got: u64 },
}

impl Cursor {
    pub fn admit(&mut self, seq: u64, load_only: bool, chunk: Option<&KvSnapshotChunk>) -> Admit {
        let verdict = match (*self, load_only) {
            (Cursor::Broken { expected }, _) => Admit::Gap { expected, got: seq },
            (Cursor::Fresh, true) => Admit::LoadOnly,
            (Cursor::Live { last, .. }, true) if seq <= last => Admit::LoadOnly,
            (Cursor::Live { last, .. }, true) => Admit::Gap {
                expected: last + 1,
                got: seq,
            },
            (Cursor::Fresh, false) => match chunk {
                Some(c) if c.index > 0 => Admit::Gap {
                    expected: seq - u64::from(c.index).min(seq),
                    got: seq,
                },
                _ => Admit::Apply,
            },
            (Cursor::Live { last, .. }, false) if seq <= last => Admit::Duplicate,
            (Cursor::Live { last, .. }, false) if seq > last + 1 => Admit::Gap {
                expected: last + 1,
                got: seq,
            },
            (Cursor::Live { next_chunk, .. }, false) => match (chunk, next_chunk) {
                (Some(c), Some(n)) if c.index != n && c.index != 0 => Admit::Gap {
                    expected: seq,
                    got: seq,
                },
                (Some(c), None) if c.index != 0 => Admit::Gap {
                    expected: seq,
                    got: seq,
                },
                _ => Admit::Apply,
            },
        };
        match verdict {
            Admit::Apply => {
                let next_chunk = chunk.and_then(|c| (c.index + 1 < c.count).then_some(c.index + 1));
                *self = Cursor::Live { last: seq, next_chunk };
            }
            Admit::Gap { expected, .. } => *self = Cursor::Broken { expected },
            Admit::LoadOnly | Admit::Duplicate => {}
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(index: u32, count: u32) -> KvSnapshotChunk {
        KvSnapshotChunk {
            index,
            count,
            blocks: 0,
            unknown_before: 0,
        }
    }

    #[test]
    fn in_order_then_duplicate_then_gap() {
        let mut c = Cursor::Fresh;
        assert_eq!(
            c.admit(41, false, None),
            Admit::Apply,
            "a fresh subscription starts anywhere"
        );
        assert_eq!(c.admit(42, false, None), Admit::Apply);
        assert_eq!(c.admit(42, false, None), Admit::Duplicate);
        assert_eq!(c.admit(40, false, None), Admit::Duplicate);
        assert_eq!(c.admit(44, false, None), Admit::Gap { expected: 43, got: 44 });
        assert_eq!(
            c.admit(43, false, None),
            Admit::Gap { expected: 43, got: 43 },
            "broken until reset"
        );
        c = Cursor::Fresh;
        assert_eq!(c.admit(45, false, None), Admit::Apply);
    }

    #[test]
    fn load_only_batches_repeat_the_last_number() {
        let mut c = Cursor::Fresh;
        assert_eq!(
            c.admit(0, true, None),
            Admit::LoadOnly,
            "a heartbeat before the first batch"
        );
        assert_eq!(
            c.admit(0, false, None),
            Admit::Apply,
            "the first batch numbered 0 is no duplicate"
        );
        assert_eq!(c.admit(0, true, None), Admit::LoadOnly);
        assert_eq!(c.admit(1, false, None), Admit::Apply);
        assert_eq!(
            c.admit(3, true, None),
            Admit::Gap { expected: 2, got: 3 },
            "batch 2 was lost"
        );
    }

    #[test]
    fn snapshot_chunks_in_order() {
        let mut c = Cursor::Fresh;
        assert_eq!(c.admit(10, false, Some(&chunk(0, 3))), Admit::Apply);
        assert_eq!(c.admit(11, false, Some(&chunk(1, 3))), Admit::Apply);
        assert_eq!(c.admit(12, false, Some(&chunk(2, 3))), Admit::Apply);
        assert_eq!(
            c.admit(13, false, None),
            Admit::Apply,
            "live events follow the last chunk"
        );

        let mut c = Cursor::Fresh;
        assert_eq!(
            c.admit(11, false, Some(&chunk(1, 3))),
            Admit::Gap { expected: 10, got: 11 },
            "joined mid-snapshot"
        );

        let mut c = Cursor::Fresh;
        c.admit(10, false, Some(&chunk(0, 3)));
        assert_eq!(
            c.admit(11, false, Some(&chunk(2, 3))),
            Admit::Gap { expected: 11, got: 11 },
            "chunk 1 missing"
        );
    }
}
