//! Text ↔ token ids, exact to the model's own tokenizer, fast, and cached.
//!
//! Two engines behind one type: the `tokenizers` crate (any `tokenizer.json`), and this crate's fast
//! encoder (`fast`: added tokens, pre-tokenizer patterns, byte-level BPE) used whenever it can
//! reproduce the tokenizer exactly, which covers the byte-level BPE families (Llama 3, DeepSeek,
//! GPT-2/cl100k style) and tiktoken rank files. Encoding goes through the token cache (`cache`):
//! exact prompts (L0) and prompts extending a cached one at an added-token boundary (L1).

mod added;
mod bpe;
mod cache;
mod fast;
mod hash;
mod pattern;
mod tiktoken;
mod unicode;
#[rustfmt::skip]
mod unicode_tables;

use std::path::Path;
use std::sync::Arc;

use tokenizers::Tokenizer;

pub use cache::CacheStats;
use cache::{Boundary, TokenCache};
use fast::FastTokenizer;
use hash::PrefixHasher;

pub use unicode::{is_python_printable, is_python_space};

/// Default token cache bounds: prompts kept, and bytes of text, ids and bookkeeping.
pub const DEFAULT_CACHE_ENTRIES: usize = 4096;
pub const DEFAULT_CACHE_BYTES: usize = 128 << 20;

pub struct TextTokenizer {
    hf: Option<Tokenizer>,
    fast: Option<FastTokenizer>,
    /// Why the fast encoder is not used, when it is not.
    fast_refused: Option<String>,
    /// Computed once: `tokenizers` rebuilds its whole vocabulary map to count it.
    vocab_size: usize,
    /// The post-processor adds no special tokens (none, or `ByteLevel`): with or without them,
    /// encoding is the same.
    post_adds_nothing: bool,
    cache: TokenCache,
}

impl TextTokenizer {
    /// A `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot load tokenizer {}: {e}", path.display()))?;
        Self::from_json_bytes(&bytes).map_err(|e| format!("cannot load tokenizer {}: {e}", path.display()))
    }

    /// The contents of a `tokenizer.json`.
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self, String> {
        let hf = Tokenizer::from_bytes(bytes).map_err(|e| e.to_string())?;
        let json: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let (fast, fast_refused) = match FastTokenizer::from_tokenizer_json(&json) {
            Ok(fast) => match agrees_on_added_tokens(&fast, &hf, &json) {
                Ok(()) => (Some(fast), None),
                Err(why) => (None, Some(why)),
            },
            Err(why) => (None, Some(why)),
        };
        let post = json["post_processor"]["type"].as_str();
        let mut tokenizer = Self::assemble(Some(hf), fast, fast_refused);
        tokenizer.post_adds_nothing = matches!(post, None | Some("ByteLevel"));
        Ok(tokenizer)
    }

    /// A tiktoken rank file. `encoding` gives the split pattern and special tokens; without it the
    /// file's stem must name a known encoding (`cl100k_base`).
    pub fn from_tiktoken(path: &Path, encoding: Option<(&str, &[(String, u32)])>) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let ranks = tiktoken::parse_ranks(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let known = tiktoken::known_encoding(stem);
        let (pattern, specials) = match (encoding, &known) {
            (Some((pattern, specials)), _) => (pattern, specials.to_vec()),
            (None, Some((pattern, specials))) => (*pattern, specials.clone()),
            (None, None) => return Err(format!("{}: unknown tiktoken encoding '{stem}'", path.display())),
        };
        let fast =
            FastTokenizer::from_tiktoken(ranks, pattern, &specials).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self::assemble(None, Some(fast), None))
    }

    fn assemble(hf: Option<Tokenizer>, fast: Option<FastTokenizer>, fast_refused: Option<String>) -> Self {
        let vocab_size = match (&hf, &fast) {
            (Some(hf), _) => hf.get_vocab_size(true),
            (None, Some(fast)) => fast.max_id(),
            (None, None) => 0,
        };
        let cache = TokenCache::new(DEFAULT_CACHE_ENTRIES, DEFAULT_CACHE_BYTES);
        // tiktoken encodings (no `tokenizers` pipeline) add nothing.
        let post_adds_nothing = hf.is_none();
        TextTokenizer {
            hf,
            fast,
            fast_refused,
            vocab_size,
            post_adds_nothing,
            cache,
        }
    }

    /// `Ok` when the fast encoder is in use, else why not.
    pub fn fast_path(&self) -> Result<(), &str> {
        match &self.fast_refused {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    /// Token ids of `text`. Special-token markup in the text (as chat templates emit it) maps to the
    /// special ids; no BOS/EOS is added (chat templates write their own), as `apply_chat_template`
    /// does. Served from the token cache where possible; safe to call from many threads.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode_shared(text).map(|ids| ids.to_vec())
    }

    /// As `encode`, sharing the cached ids instead of copying them.
    pub fn encode_shared(&self, text: &str) -> Result<Arc<[u32]>, String> {
        let hash = PrefixHasher::new(text).at(text.len());
        if let Some(ids) = self.cache.get_exact(text, hash) {
            return Ok(ids);
        }
        let (ids, boundaries) = match &self.fast {
            Some(fast) => self.encode_with_prefix_cache(fast, text),
            None => {
                self.cache.count_tokenized(text.len());
                (self.encode_uncached(text)?.into(), Vec::new())
            }
        };
        self.cache.insert(text.into(), ids.clone(), hash, boundaries);
        Ok(ids)
    }

    /// Split at added tokens, reuse the longest cached prefix, tokenize the rest.
    fn encode_with_prefix_cache(&self, fast: &FastTokenizer, text: &str) -> (Arc<[u32]>, Vec<Boundary>) {
        let mut pieces = Vec::new();
        fast.split(text, &mut |piece| pieces.push(piece));
        let mut hasher = PrefixHasher::new(text);
        let mut boundaries: Vec<Boundary> = pieces
            .iter()
            .filter_map(|p| match p {
                added::Piece::Token(_, range) => Some(Boundary {
                    hash: hasher.at(range.end),
                    end: range.end,
                    ids: 0,
                }),
                added::Piece::Text(_) => None,
            })
            .collect();
        let hit = self.cache.longest_prefix(text, &boundaries);
        let (start, mut ids) = match &hit {
            Some(hit) => (hit.end, hit.ids[..hit.count].to_vec()),
            None => (0, Vec::with_capacity(text.len() / 3)),
        };
        self.cache.count_tokenized(text.len() - start);
        let mut next_boundary = boundaries
            .iter()
            .position(|b| b.end > start)
            .unwrap_or(boundaries.len());
        for piece in pieces {
            match piece {
                added::Piece::Text(range) if range.start >= start => fast.encode_text(&text[range], &mut ids),
                added::Piece::Token(id, range) if range.start >= start => {
                    ids.push(id);
                    boundaries[next_boundary].ids = ids.len();
                    next_boundary += 1;
                }
                _ => {}
            }
        }
        // Boundaries before the reused prefix are already cached under an older record.
        let first_new = boundaries
            .iter()
            .position(|b| b.end > start)
            .unwrap_or(boundaries.len());
        boundaries.drain(..first_new);
        (ids.into(), boundaries)
    }

    /// Token ids of `text` without the cache.
    pub fn encode_uncached(&self, text: &str) -> Result<Vec<u32>, String> {
        if let Some(fast) = &self.fast {
            let mut ids = Vec::with_capacity(text.len() / 3);
            fast.encode(text, &mut ids);
            return Ok(ids);
        }
        self.hf
            .as_ref()
            .expect("a tokenizer without the fast encoder has the tokenizers one")
            .encode_fast(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| format!("tokenization failed: {e}"))
    }

    /// Token ids with the tokenizer's own special tokens added (its post-processor: BOS etc.), as
    /// `tokenizer(text)` does for plain completions. Cached when the post-processor adds nothing.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>, String> {
        if self.post_adds_nothing {
            return self.encode(text);
        }
        match &self.hf {
            Some(hf) => hf
                .encode_fast(text, true)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| format!("tokenization failed: {e}")),
            None => self.encode_uncached(text),
        }
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        if let Some(fast) = self.fast.as_ref().filter(|f| f.byte_decoder) {
            let mut bytes = Vec::with_capacity(ids.len() * 4);
            fast.decode_bytes(ids, skip_special_tokens, &mut bytes);
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        match &self.hf {
            Some(hf) => hf.decode(ids, skip_special_tokens).unwrap_or_default(),
            None => String::new(),
        }
    }

    /// For byte-level decoders: the bytes `id` contributes to `decode` (none if skipped or unknown).
    /// `None` means decoding is not byte concatenation and must go through `decode`.
    pub fn byte_decoder(&self) -> Option<ByteDecoder<'_>> {
        self.fast.as_ref().filter(|f| f.byte_decoder).map(ByteDecoder)
    }

    /// The vocabulary piece of `id` (e.g. "Ġhello"), as `convert_ids_to_tokens` gives it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match (&self.hf, &self.fast) {
            (Some(hf), _) => hf.id_to_token(id),
            (None, Some(fast)) => fast.id_to_token(id),
            (None, None) => None,
        }
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        match (&self.hf, &self.fast) {
            (Some(hf), _) => hf.token_to_id(token),
            (None, Some(fast)) => {
                let mut ids = Vec::new();
                fast.split(token, &mut |piece| {
                    if let added::Piece::Token(id, range) = piece {
                        if range == (0..token.len()) {
                            ids.push(id);
                        }
                    }
                });
                ids.first().copied().or_else(|| fast.id_of_bytes(token.as_bytes()))
            }
            (None, None) => None,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The longest vocabulary piece, in bytes of its written form (at least the bytes of text it
    /// stands for: "Ġ" is 2 bytes for 1, "<0x0A>" 6 for 1); 1 for an empty vocabulary.
    pub fn longest_token_bytes(&self) -> usize {
        (0..self.vocab_size as u32)
            .filter_map(|id| self.id_to_token(id))
            .map(|piece| piece.len())
            .max()
            .unwrap_or(1)
            .max(1)
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    pub fn clear_cache(&self) {
        self.cache.clear();
    }

    /// Bound the token cache (0 entries turns it off).
    pub fn set_cache_limits(&self, max_entries: usize, max_bytes: usize) {
        self.cache.set_limits(max_entries, max_bytes);
    }
}

/// Byte-level decoding, token by token (for the incremental detokenizer).
#[derive(Clone, Copy)]
pub struct ByteDecoder<'a>(&'a FastTokenizer);

impl ByteDecoder<'_> {
    /// Append what `ids` decode to, before UTF-8 validation.
    pub fn extend(&self, ids: &[u32], skip_special_tokens: bool, out: &mut Vec<u8>) {
        self.0.decode_bytes(ids, skip_special_tokens, out);
    }
}

/// The fast encoder must map every added token to the id the `tokenizers` crate gives it.
fn agrees_on_added_tokens(fast: &FastTokenizer, hf: &Tokenizer, json: &serde_json::Value) -> Result<(), String> {
    for token in json["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let content = token["content"].as_str().unwrap_or_default();
        let mut ids = Vec::new();
        fast.encode(content, &mut ids);
        let expected = hf.encode_fast(content, false).map_err(|e| e.to_string())?;
        if ids != expected.get_ids() {
            return Err(format!("added token {content:?} encodes differently"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
