//! Byte-level mutations of one input, as coverage-guided fuzzers stack them: bit flips, edge-value bytes
//! and integers, range insertion, deletion and duplication, splices from another input, and tokens from a
//! per-target dictionary (JSON punctuation, field names, protobuf tags).

use crate::rng::Rng;

/// The most bytes an input grows to: big enough for every limit the parsers check below it.
pub const MAX_INPUT: usize = 64 * 1024;

const EDGE_BYTES: [u8; 10] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'{', b'[', b'\n'];
const EDGE_INTS: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    u64::MAX,
];

/// Apply 1..=8 stacked mutations to `input`; `other` is a splice partner, `dictionary` extra tokens.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8], dictionary: &[&[u8]]) {
    let rounds = 1 + rng.below(8);
    for _ in 0..rounds {
        mutate_once(rng, input, other, dictionary);
    }
    input.truncate(MAX_INPUT);
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8], dictionary: &[&[u8]]) {
    let len = input.len();
    match rng.below(10) {
        0 if len > 0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = rng.below(len);
            input[at] = *rng.pick(&EDGE_BYTES);
        }
        2 if len > 0 => {
            // An edge integer written over the input, little- or big-endian, 1 to 8 bytes wide.
            let width = 1 + rng.below(8);
            let value = *rng.pick(&EDGE_INTS);
            let bytes = if rng.one_in(2) {
                value.to_le_bytes()
            } else {
                value.to_be_bytes()
            };
            let at = rng.below(len);
            for (i, b) in bytes[8 - width..].iter().enumerate() {
                if let Some(slot) = input.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
        3 if len > 0 => {
            let at = rng.below(len);
            let n = rng.size(len - at);
            input.drain(at..at + n);
        }
        4 if len > 0 => {
            // Duplicate a range in place (repeated fields, nested brackets).
            let at = rng.below(len);
            let n = rng.size((len - at).min(256));
            let copy = input[at..at + n].to_vec();
            let to = rng.below(input.len() + 1);
            input.splice(to..to, copy);
        }
        5 if !other.is_empty() => {
            let from = rng.below(other.len());
            let n = rng.size((other.len() - from).min(512));
            let to = rng.below(len + 1);
            input.splice(to..to, other[from..from + n].iter().copied());
        }
        6 | 7 if !dictionary.is_empty() => {
            let token = rng.pick(dictionary);
            let to = rng.below(len + 1);
            if rng.one_in(2) && to + token.len() <= len {
                input[to..to + token.len()].copy_from_slice(token);
            } else {
                input.splice(to..to, token.iter().copied());
            }
        }
        8 => {
            let to = rng.below(len + 1);
            let n = rng.size(16);
            let random = rng.bytes(n);
            input.splice(to..to, random);
        }
        _ if len > 1 => {
            // Truncate: every parser must handle a cut-off input.
            let keep = rng.below(len);
            input.truncate(keep);
        }
        _ => input.push(rng.next_u64() as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_mutations() {
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut input = br#"{"model": "m", "prompt": "hi"}"#.to_vec();
            for _ in 0..100 {
                mutate(&mut rng, &mut input, b"[1, 2, 3]", &[b"\"stream\"", b"null"]);
            }
            input
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn inputs_stay_within_the_bound() {
        let mut rng = Rng::new(1);
        let mut input = vec![b'x'; MAX_INPUT];
        let other = vec![b'y'; 512];
        for _ in 0..200 {
            mutate(&mut rng, &mut input, &other, &[]);
            assert!(input.len() <= MAX_INPUT);
        }
    }
}
