//! A served model: tokenizer, chat template and limits loaded from a Hugging Face style directory.

use std::fs;
use std::path::Path;

use serde_json::Value as Json;

use crate::template::ChatTemplate;
use crate::tokenize::TextTokenizer;

pub struct ModelFiles {
    pub tokenizer: TextTokenizer,
    pub template: Option<ChatTemplate>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub eos_token_ids: Vec<u32>,
    /// Context length from `config.json` / `tokenizer_config.json`, if the directory says.
    pub max_context: Option<u32>,
}

fn read_json(path: &Path) -> Result<Option<Json>, String> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{} is not valid JSON: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// `"<s>"` or `{"content": "<s>", ...}` (an AddedToken) → `"<s>"`.
fn token_text(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The chat template: `chat_template.jinja` wins over `tokenizer_config.json`'s `chat_template`, which
/// is either a string or a list of named templates (the one named "default" is used).
fn template_source(dir: &Path, config: Option<&Json>) -> Result<Option<String>, String> {
    let file = dir.join("chat_template.jinja");
    if file.is_file() {
        return fs::read_to_string(&file)
            .map(Some)
            .map_err(|e| format!("cannot read {}: {e}", file.display()));
    }
    Ok(match config.and_then(|c| c.get("chat_template")) {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    })
}

fn ids_of(value: Option<&Json>) -> Vec<u32> {
    match value {
        Some(Json::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Json::Array(items)) => items.iter().filter_map(Json::as_u64).map(|id| id as u32).collect(),
        _ => Vec::new(),
    }
}

impl ModelFiles {
    pub fn load(dir: &Path) -> Result<Self, String> {
        let tokenizer = TextTokenizer::from_file(&dir.join("tokenizer.json"))?;
        let tok_config = read_json(&dir.join("tokenizer_config.json"))?;
        let gen_config = read_json(&dir.join("generation_config.json"))?;
        let model_config = read_json(&dir.join("config.json"))?;
        let template = template_source(dir, tok_config.as_ref())?
            .map(|source| ChatTemplate::compile(&source))
            .transpose()?;
        let bos_token = token_text(tok_config.as_ref().and_then(|c| c.get("bos_token")));
        let eos_token = token_text(tok_config.as_ref().and_then(|c| c.get("eos_token")));
        let mut eos_token_ids = ids_of(gen_config.as_ref().and_then(|c| c.get("eos_token_id")));
        if eos_token_ids.is_empty() {
            eos_token_ids = ids_of(model_config.as_ref().and_then(|c| c.get("eos_token_id")));
        }
        if eos_token_ids.is_empty() {
            eos_token_ids.extend(eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)));
        }
        let max_context = model_config
            .as_ref()
            .and_then(|c| c.get("max_position_embeddings"))
            .and_then(Json::as_u64)
            .or_else(|| {
                // tokenizer_config's model_max_length is a huge sentinel when unknown.
                tok_config
                    .as_ref()
                    .and_then(|c| c.get("model_max_length"))
                    .and_then(Json::as_u64)
                    .filter(|&n| n < 10_000_000)
            })
            .map(|n| n as u32);
        Ok(ModelFiles { tokenizer, template, bos_token, eos_token, eos_token_ids, max_context })
    }
}
