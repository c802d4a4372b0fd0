//! A served model: tokenizer, chat templates and limits loaded from a Hugging Face style directory.
//!
//! Files read, as `transformers` reads them: `tokenizer.json` (or a tiktoken rank file),
//! `tokenizer_config.json` (special tokens, `add_bos_token`, `chat_template` as a string or a list
//! of named templates), `special_tokens_map.json` (legacy), `chat_template.jinja` and
//! `additional_chat_templates/*.jinja` (which win over the config's templates),
//! `generation_config.json` and `config.json` (EOS ids, context length). Templates are compiled
//! once here and shared by every request for the model.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::template::{ChatInputs, ChatTemplate, RenderError};
use crate::tokenize::TextTokenizer;

/// The special-token attributes `transformers` exposes to chat templates, in its order.
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

pub struct ModelFiles {
    pub tokenizer: TextTokenizer,
    /// The template used when none is named: the only one, or the one named "default".
    pub template: Option<ChatTemplate>,
    /// Further named templates (e.g. "tool_use"), when the model has several.
    pub named_templates: BTreeMap<String, ChatTemplate>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub eos_token_ids: Vec<u32>,
    /// Context length from `config.json` / `tokenizer_config.json`, if the directory says.
    pub max_context: Option<u32>,
    /// Whether plain prompts start with BOS (`add_bos_token`; chat templates write their own).
    pub add_bos_token: bool,
    /// The named special tokens templates see (`bos_token`, `eos_token`, `pad_token`, ...).
    pub special_tokens: Map<String, Json>,
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

fn read_text(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// `"<s>"` or `{"content": "<s>", ...}` (an AddedToken) → `"<s>"`.
fn token_text(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// Template sources by name ("default" for the main one). Files win over the config's entry.
fn template_sources(dir: &Path, config: Option<&Json>) -> Result<BTreeMap<String, String>, String> {
    let mut sources = BTreeMap::new();
    let file = dir.join("chat_template.jinja");
    if file.is_file() {
        sources.insert("default".to_string(), read_text(&file)?);
    }
    if let Ok(entries) = fs::read_dir(dir.join("additional_chat_templates")) {
        for path in entries.flatten().map(|e| e.path()) {
            if let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".jinja"))
            {
                sources.insert(name.to_string(), read_text(&path)?);
            }
        }
    }
    if !sources.is_empty() {
        return Ok(sources);
    }
    match config.and_then(|c| c.get("chat_template")) {
        Some(Json::String(s)) => {
            sources.insert("default".to_string(), s.clone());
        }
        Some(Json::Array(named)) => {
            for entry in named {
                if let (Some(name), Some(source)) = (entry["name"].as_str(), entry["template"].as_str()) {
                    sources.insert(name.to_string(), source.to_string());
                }
            }
        }
        _ => {}
    }
    Ok(sources)
}

fn ids_of(value: Option<&Json>) -> Vec<u32> {
    match value {
        Some(Json::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Json::Array(items)) => items.iter().filter_map(Json::as_u64).map(|id| id as u32).collect(),
        _ => Vec::new(),
    }
}

/// A tiktoken rank file in `dir` (`*.tiktoken` or `tiktoken.model`), if any.
fn tiktoken_file(dir: &Path) -> Option<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "tiktoken") || p.file_name().is_some_and(|n| n == "tiktoken.model")
        })
        .collect();
    files.sort();
    files.into_iter().next()
}

fn load_tokenizer(dir: &Path, config: Option<&Json>) -> Result<TextTokenizer, String> {
    let json = dir.join("tokenizer.json");
    if json.is_file() {
        return TextTokenizer::from_file(&json);
    }
    let Some(ranks) = tiktoken_file(dir) else {
        return Err(format!(
            "{} has neither tokenizer.json nor a tiktoken file",
            dir.display()
        ));
    };
    // A config may spell out the encoding: its split pattern and its special tokens.
    let pattern = config.and_then(|c| c.get("pat_str")).and_then(Json::as_str);
    let specials: Vec<(String, u32)> = config
        .and_then(|c| c.get("added_tokens_decoder"))
        .and_then(Json::as_object)
        .map(|decoder| {
            decoder
                .iter()
                .filter_map(|(id, t)| Some((t.get("content")?.as_str()?.to_string(), id.parse().ok()?)))
                .collect()
        })
        .unwrap_or_default();
    match pattern {
        Some(pattern) => TextTokenizer::from_tiktoken(&ranks, Some((pattern, &specials))),
        None => TextTokenizer::from_tiktoken(&ranks, None),
    }
}

impl ModelFiles {
    pub fn load(dir: &Path) -> Result<Self, String> {
        let tok_config = read_json(&dir.join("tokenizer_config.json"))?;
        let tokenizer = load_tokenizer(dir, tok_config.as_ref())?;
        let gen_config = read_json(&dir.join("generation_config.json"))?;
        let model_config = read_json(&dir.join("config.json"))?;
        let legacy_map = read_json(&dir.join("special_tokens_map.json"))?;

        let mut named_templates = BTreeMap::new();
        for (name, source) in template_sources(dir, tok_config.as_ref())? {
            let template = ChatTemplate::compile(&source).map_err(|e| format!("template '{name}': {e}"))?;
            named_templates.insert(name, template);
        }
        let template = named_templates.remove("default");

        // special_tokens_map.json only counts for configs that predate `added_tokens_decoder`.
        let legacy = legacy_map.filter(|_| {
            tok_config
                .as_ref()
                .is_none_or(|c| c.get("added_tokens_decoder").is_none())
        });
        let mut special_tokens = Map::new();
        for name in SPECIAL_TOKEN_NAMES {
            let value = token_text(legacy.as_ref().and_then(|m| m.get(name)))
                .or_else(|| token_text(tok_config.as_ref().and_then(|c| c.get(name))));
            if let Some(value) = value {
                special_tokens.insert(name.to_string(), Json::String(value));
            }
        }
        let bos_token = special_tokens
            .get("bos_token")
            .and_then(Json::as_str)
            .map(str::to_string);
        let eos_token = special_tokens
            .get("eos_token")
            .and_then(Json::as_str)
            .map(str::to_string);
        let add_bos_token = tok_config
            .as_ref()
            .and_then(|c| c.get("add_bos_token"))
            .and_then(Json::as_bool)
            .unwrap_or(false);

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
        Ok(ModelFiles {
            tokenizer,
            template,
            named_templates,
            bos_token,
            eos_token,
            eos_token_ids,
            max_context,
            add_bos_token,
            special_tokens,
        })
    }

    /// The template `transformers` picks: the one named, else "tool_use" when tools are given and the
    /// model has one, else the default.
    pub fn chat_template(&self, name: Option<&str>, with_tools: bool) -> Result<&ChatTemplate, String> {
        match name {
            Some("default") => self
                .template
                .as_ref()
                .ok_or_else(|| "the model has no default chat template".into()),
            Some(name) => self
                .named_templates
                .get(name)
                .ok_or_else(|| format!("the model has no chat template '{name}'")),
            None if with_tools && self.named_templates.contains_key("tool_use") => {
                Ok(&self.named_templates["tool_use"])
            }
            None => self.template.as_ref().ok_or_else(|| {
                if self.named_templates.is_empty() {
                    "the model has no chat template".to_string()
                } else {
                    let names: Vec<&String> = self.named_templates.keys().collect();
                    format!("the model has several chat templates and no default; available: {names:?}")
                }
            }),
        }
    }

    /// `apply_chat_template(..., tokenize=False)` with this model's templates and special tokens.
    pub fn render_chat(&self, template_name: Option<&str>, inputs: ChatInputs) -> Result<String, RenderError> {
        let template = self
            .chat_template(template_name, inputs.tools.is_some())
            .map_err(RenderError::Raised)?;
        template.apply(&ChatInputs {
            special_tokens: Some(&self.special_tokens),
            ..inputs
        })
    }
}
