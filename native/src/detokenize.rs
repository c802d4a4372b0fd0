//! Incremental detokenization: text deltas from a growing token stream.
//!
//! Decoding token by token is wrong for byte-level vocabularies (one character may span several
//! tokens) and for decoders that merge a token with its neighbours. The decoder keeps two offsets into
//! the ids: text is decoded over a short window `[prefix, ..]` and only the part beyond what the window
//! `[prefix, read)` already produced is emitted, and only once it does not end in an incomplete
//! character (U+FFFD).

use crate::tokenize::TextTokenizer;

#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder { skip_special_tokens, ..Default::default() }
    }

    /// Add tokens; return the text they complete (possibly empty).
    pub fn push(&mut self, tokenizer: &TextTokenizer, new_ids: &[u32]) -> String {
        self.ids.extend_from_slice(new_ids);
        self.emit(tokenizer, false)
    }

    /// Everything still held back (an incomplete character at the very end is emitted as U+FFFD).
    pub fn flush(&mut self, tokenizer: &TextTokenizer) -> String {
        self.emit(tokenizer, true)
    }

    fn emit(&mut self, tokenizer: &TextTokenizer, force: bool) -> String {
        if self.read_offset == self.ids.len() {
            return String::new();
        }
        let skip = self.skip_special_tokens;
        let prefix_text = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], skip);
        let full_text = tokenizer.decode(&self.ids[self.prefix_offset..], skip);
        let complete = !full_text.ends_with('\u{FFFD}');
        if full_text.len() > prefix_text.len() && (complete || force) {
            let delta = full_text.get(prefix_text.len()..).unwrap_or_default().to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return delta;
        }
        String::new()
    }
}
