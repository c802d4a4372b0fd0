//! tiktoken BPE rank files (`<base64 token> <rank>` per line) and the encodings they belong to.
//!
//! The file holds only the ranks; the split pattern and special tokens are part of the encoding's
//! definition, so known encodings are looked up by name and others must be given both.

use super::hash::FastMap;

/// The public definition of OpenAI's `cl100k_base` (split pattern and special tokens).
pub const CL100K_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
pub const CL100K_SPECIALS: [(&str, u32); 5] = [
    ("<|endoftext|>", 100257),
    ("<|fim_prefix|>", 100258),
    ("<|fim_middle|>", 100259),
    ("<|fim_suffix|>", 100260),
    ("<|endofprompt|>", 100276),
];

/// Pattern and special tokens of a known encoding, by the rank file's stem (`cl100k_base`).
pub fn known_encoding(name: &str) -> Option<(&'static str, Vec<(String, u32)>)> {
    match name {
        "cl100k_base" => Some((
            CL100K_PATTERN,
            CL100K_SPECIALS.iter().map(|(t, id)| (t.to_string(), *id)).collect(),
        )),
        _ => None,
    }
}

fn base64_value(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    } as u32)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in digits {
        acc = (acc << 6) | base64_value(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Token bytes → rank, from the text of a `.tiktoken` file.
pub fn parse_ranks(text: &str) -> Result<FastMap<Box<[u8]>, u32>, String> {
    let mut ranks = FastMap::default();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let (token, rank) = line
            .split_once(' ')
            .ok_or(format!("line {}: expected '<base64> <rank>'", n + 1))?;
        let bytes = base64_decode(token).ok_or(format!("line {}: bad base64", n + 1))?;
        let rank = rank
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("line {}: bad rank", n + 1))?;
        ranks.insert(bytes.into_boxed_slice(), rank);
    }
    Ok(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_base64_ranks() {
        let ranks = parse_ranks("IQ== 0\nIg== 1\nIHRoZQ== 2\n").unwrap();
        assert_eq!(ranks.get(&b"!"[..]), Some(&0));
        assert_eq!(ranks.get(&b" the"[..]), Some(&2));
        assert!(parse_ranks("IQ==\n").is_err());
    }
}
