//! Text ↔ token ids with the Hugging Face `tokenizers` crate, without offsets or per-token strings.

use std::path::Path;

use tokenizers::Tokenizer;

pub struct TextTokenizer {
    inner: Tokenizer,
}

impl TextTokenizer {
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let inner = Tokenizer::from_file(path)
            .map_err(|e| format!("cannot load tokenizer {}: {e}", path.display()))?;
        Ok(TextTokenizer { inner })
    }

    /// Token ids of `text`. Special-token markup in the text (as chat templates emit it) maps to the
    /// special ids; no BOS/EOS is added (chat templates write their own), as `apply_chat_template` does.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner
            .encode_fast(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| format!("tokenization failed: {e}"))
    }

    /// Token ids of a raw prompt with the tokenizer's own special tokens added (BOS, per its
    /// post-processor), as `tokenizer(prompt)` does for `/v1/completions`.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner
            .encode_fast(text, true)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| format!("tokenization failed: {e}"))
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.inner.decode(ids, skip_special_tokens).unwrap_or_default()
    }

    /// The vocabulary piece of `id` (e.g. "Ġhello"), as `convert_ids_to_tokens` gives it.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
