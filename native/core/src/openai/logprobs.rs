//! OpenAI `logprobs` objects from engine logprobs: chat's `{"content": [...]}` and the legacy
//! completions' parallel lists. Token strings are the tokenizer's decoding of each single id (as vLLM
//! shows them); `bytes` are that string's UTF-8 bytes.

use serde_json::{json, Map, Value};

use crate::engine::TokenLogprob;
use crate::tokenize::TextTokenizer;

/// JSON has no -inf; vLLM clamps it to this.
const FLOOR: f32 = -9999.0;

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        FLOOR
    }
}

fn token_text(tokenizer: &TextTokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false)
}

fn chat_entry(token: String, logprob: f32) -> Map<String, Value> {
    let bytes: Vec<u8> = token.as_bytes().to_vec();
    let mut entry = Map::new();
    entry.insert("token".into(), token.into());
    entry.insert("logprob".into(), json!(finite(logprob)));
    entry.insert("bytes".into(), json!(bytes));
    entry
}

/// Chat `content` entries for `tokens`, each with its first `top` alternatives.
pub fn chat_content(tokenizer: &TextTokenizer, tokens: &[TokenLogprob], top: usize) -> Vec<Value> {
    tokens
        .iter()
        .map(|t| {
            let mut entry = chat_entry(token_text(tokenizer, t.id), t.logprob);
            let alternatives: Vec<Value> = t
                .top
                .iter()
                .take(top)
                .map(|&(id, lp)| Value::Object(chat_entry(token_text(tokenizer, id), lp)))
                .collect();
            entry.insert("top_logprobs".into(), Value::Array(alternatives));
            Value::Object(entry)
        })
        .collect()
}

/// `{"content": [...]}`, the chat choice's `logprobs`.
pub fn chat_logprobs(content: Vec<Value>) -> Value {
    json!({ "content": content })
}

/// The legacy completions object, its `text_offset`s counted (in characters, as Python's `len`) from
/// `offset`, which it advances past these tokens.
#[derive(Debug, Default)]
pub struct CompletionLogprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl CompletionLogprobs {
    pub fn push(&mut self, tokenizer: &TextTokenizer, tokens: &[TokenLogprob], top: usize, offset: &mut usize) {
        for t in tokens {
            let text = token_text(tokenizer, t.id);
            // The sampled token is always among the alternatives, then the top ones.
            let mut alternatives = Map::new();
            alternatives.insert(text.clone(), json!(finite(t.logprob)));
            for &(id, lp) in t.top.iter().take(top) {
                alternatives
                    .entry(token_text(tokenizer, id))
                    .or_insert(json!(finite(lp)));
            }
            self.text_offset.push(json!(*offset));
            *offset += text.chars().count();
            self.token_logprobs.push(json!(finite(t.logprob)));
            self.top_logprobs.push(Value::Object(alternatives));
            self.tokens.push(Value::String(text));
        }
    }

    pub fn to_value(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_logprobs_become_the_floor() {
        assert_eq!(finite(f32::NEG_INFINITY), FLOOR);
        assert_eq!(finite(f32::NAN), FLOOR);
        assert_eq!(finite(-0.5), -0.5);
    }
}
