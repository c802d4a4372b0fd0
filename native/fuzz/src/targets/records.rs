//! A binary format for input sequences: a one-byte header, then records of a kind byte, a 16-bit
//! little-endian length and that many payload bytes. Reading is lenient (a short last record takes what is
//! left), so any bytes are a valid sequence and byte mutations stay meaningful.

use crate::rng::Rng;

pub struct Record<'a> {
    pub kind: u8,
    pub payload: &'a [u8],
}

/// The header byte and the records after it.
pub fn read(data: &[u8]) -> (u8, Vec<Record<'_>>) {
    let Some((&header, mut rest)) = data.split_first() else {
        return (0, Vec::new());
    };
    let mut records = Vec::new();
    while let Some((&kind, after)) = rest.split_first() {
        let len = match after {
            [lo, hi, ..] => usize::from(u16::from_le_bytes([*lo, *hi])),
            _ => 0,
        };
        let body = after.get(2..).unwrap_or_default();
        let len = len.min(body.len());
        records.push(Record {
            kind,
            payload: &body[..len],
        });
        rest = &body[len..];
    }
    (header, records)
}

/// Writes a sequence `read` returns as is (payloads are cut at 64 KiB).
pub fn write(header: u8, records: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![header];
    for (kind, payload) in records {
        let len = payload.len().min(usize::from(u16::MAX));
        out.push(*kind);
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&payload[..len]);
    }
    out
}

/// A structure-aware mutation of a sequence: a record dropped, repeated, swapped or its kind changed.
pub fn mutate(rng: &mut Rng, data: &[u8], kinds: u8) -> Option<Vec<u8>> {
    let (header, records) = read(data);
    let mut owned: Vec<(u8, Vec<u8>)> = records.iter().map(|r| (r.kind, r.payload.to_vec())).collect();
    if owned.is_empty() {
        return None;
    }
    let at = rng.below(owned.len());
    match rng.below(5) {
        0 => {
            owned.remove(at);
        }
        1 => {
            let copy = owned[at].clone();
            owned.insert(at, copy);
        }
        2 => {
            let other = rng.below(owned.len());
            owned.swap(at, other);
        }
        3 => owned[at].0 = rng.below(usize::from(kinds)) as u8 | (owned[at].0 & 0x80),
        _ => owned[at].0 ^= 0x80,
    }
    Some(write(header ^ (rng.one_in(8) as u8), &owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_records_read_back() {
        let data = write(7, &[(1, b"abc".to_vec()), (0x82, Vec::new())]);
        let (header, records) = read(&data);
        assert_eq!(header, 7);
        let got: Vec<(u8, &[u8])> = records.iter().map(|r| (r.kind, r.payload)).collect();
        assert_eq!(got, vec![(1, &b"abc"[..]), (0x82, &b""[..])]);
    }

    #[test]
    fn a_cut_record_takes_what_is_left() {
        let (_, records) = read(&[0, 3, 10, 0, b'x', b'y']);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].payload, b"xy");
    }
}
