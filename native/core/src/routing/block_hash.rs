//! Content-addressed block hashes: a chain over full blocks of token ids, computed by the gateway so
//! the engines' own hash seeds and algorithms never matter.
//!
//! `h_0 = xxh3(tokens[0..B], seed = root)`, `h_i = xxh3(tokens[iB..(i+1)B], seed = h_{i-1})`, tokens as
//! little-endian u32 bytes. `root` is a constant unless the blocks live in a cache namespace (a LoRA
//! adapter or a cache salt), which is folded into it. Only full blocks are hashed: engines cache only
//! those. Equal hashes mean equal prefixes up to 64-bit collisions (about 2^-32 at 2^16 live blocks).

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub type BlockHash = u64;

/// The root of every chain outside a namespace.
pub const ROOT: BlockHash = 0x6578_7470_726f_6331;

/// The root of the chain for a namespace; the plain `ROOT` when neither part is set.
pub fn root(lora_name: Option<&str>, cache_salt: Option<&str>) -> BlockHash {
    let lora = lora_name.filter(|s| !s.is_empty());
    let salt = cache_salt.filter(|s| !s.is_empty());
    if lora.is_none() && salt.is_none() {
        return ROOT;
    }
    // Length-prefixed parts: ("ab", "c") and ("a", "bc") must not collide.
    let mut buf = Vec::with_capacity(16 + lora.map_or(0, str::len) + salt.map_or(0, str::len));
    for part in [lora, salt] {
        let part = part.unwrap_or("");
        buf.extend_from_slice(&(part.len() as u64).to_le_bytes());
        buf.extend_from_slice(part.as_bytes());
    }
    xxh3_64_with_seed(&buf, ROOT)
}

/// The hash of the block `tokens` following the block hashed `parent` (or following `root`).
pub fn next(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, parent)
}

/// Folds inputs beyond token ids (multimodal items) into a block's hash, so such a block never
/// matches the text-only chain of the same token ids.
pub fn with_extra(hash: BlockHash, extra: &[u8]) -> BlockHash {
    xxh3_64_with_seed(extra, hash ^ 0x9e37_79b9_7f4a_7c15)
}

/// The chain hashes of every full block of a prompt (`tokens.len() / block_size` of them).
pub fn prompt_hashes(tokens: &[u32], block_size: usize, root: BlockHash) -> Vec<BlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let full = tokens.len() / block_size;
    let bytes: Vec<u8> = tokens[..full * block_size]
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let mut out = Vec::with_capacity(full);
    let mut parent = root;
    for block in bytes.chunks_exact(block_size * 4) {
        parent = xxh3_64_with_seed(block, parent);
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_matches_block_by_block_hashing() {
        let tokens: Vec<u32> = (0..50).collect();
        let hashes = prompt_hashes(&tokens, 16, ROOT);
        assert_eq!(hashes.len(), 3, "only full blocks");
        let h0 = next(ROOT, &tokens[0..16]);
        let h1 = next(h0, &tokens[16..32]);
        let h2 = next(h1, &tokens[32..48]);
        assert_eq!(hashes, vec![h0, h1, h2]);
    }

    #[test]
    fn equal_prefixes_share_leading_hashes_only() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 9999;
        let (ha, hb) = (prompt_hashes(&a, 16, ROOT), prompt_hashes(&b, 16, ROOT));
        assert_eq!(ha[..2], hb[..2]);
        assert_ne!(ha[2], hb[2]);
        assert_ne!(ha[3], hb[3], "a difference propagates down the chain");
    }

    #[test]
    fn same_block_at_another_position_hashes_differently() {
        let block: Vec<u32> = vec![7; 16];
        let twice: Vec<u32> = block.iter().chain(block.iter()).copied().collect();
        let h = prompt_hashes(&twice, 16, ROOT);
        assert_ne!(h[0], h[1]);
    }

    #[test]
    fn namespaces_separate_chains() {
        let tokens: Vec<u32> = (0..16).collect();
        let plain = prompt_hashes(&tokens, 16, root(None, None));
        let empty = prompt_hashes(&tokens, 16, root(Some(""), Some("")));
        let lora = prompt_hashes(&tokens, 16, root(Some("adapter"), None));
        let salted = prompt_hashes(&tokens, 16, root(None, Some("adapter")));
        assert_eq!(plain, empty, "empty parts are no namespace");
        assert_ne!(plain, lora);
        assert_ne!(lora, salted, "a LoRA name and an equal salt are different namespaces");
        assert_ne!(root(Some("ab"), Some("c")), root(Some("a"), Some("bc")));
    }

    #[test]
    fn block_size_zero_or_short_prompt_gives_no_blocks() {
        assert!(prompt_hashes(&[1, 2, 3], 0, ROOT).is_empty());
        assert!(prompt_hashes(&[1, 2, 3], 16, ROOT).is_empty());
    }

    #[test]
    fn hashes_are_pinned() {
        // Indexes, benchmarks and any persisted state assume this exact function: a change must be
        // deliberate.
        let tokens: Vec<u32> = (0..16).collect();
        assert_eq!(prompt_hashes(&tokens, 16, ROOT)[0], 0x13ac_b3ef_076a_cb84);
        assert_eq!(root(Some("a"), None), 0x6371_3c14_5980_a5bb);
    }
}
