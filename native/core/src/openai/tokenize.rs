//! `POST /v1/tokenize` and `POST /v1/detokenize` in vLLM's request and response shapes.

use serde_json::{json, Value};

use super::fields::{opt_bool, opt_str, opt_u32_list};
use super::request::{parse_chat_input, parse_object, parse_prompt, ChatInput, PromptInput};
use crate::error::ApiError;

pub enum TokenizeInput {
    Chat(ChatInput),
    Text { text: String, add_special_tokens: bool },
}

pub struct TokenizeRequest {
    pub model: String,
    pub input: TokenizeInput,
    pub return_token_strs: bool,
}

pub struct DetokenizeRequest {
    pub model: String,
    pub tokens: Vec<u32>,
}

fn model_of(obj: &super::fields::Object) -> Result<String, ApiError> {
    Ok(opt_str(obj, "model")?
        .ok_or_else(|| ApiError::invalid_param("model", "'model' is required"))?
        .to_string())
}

pub fn parse_tokenize_request(body: &[u8]) -> Result<TokenizeRequest, ApiError> {
    let obj = parse_object(body)?;
    let model = model_of(&obj)?;
    let input = if obj.contains_key("messages") {
        TokenizeInput::Chat(parse_chat_input(&obj)?)
    } else {
        match parse_prompt(&obj)? {
            PromptInput::Text(text) => TokenizeInput::Text {
                text,
                add_special_tokens: opt_bool(&obj, "add_special_tokens")?.unwrap_or(true),
            },
            _ => return Err(ApiError::invalid_param("prompt", "'prompt' must be a string")),
        }
    };
    Ok(TokenizeRequest {
        model,
        input,
        return_token_strs: opt_bool(&obj, "return_token_strs")?.unwrap_or(false),
    })
}

pub fn parse_detokenize_request(body: &[u8]) -> Result<DetokenizeRequest, ApiError> {
    let obj = parse_object(body)?;
    let model = model_of(&obj)?;
    if !obj.contains_key("tokens") {
        return Err(ApiError::invalid_param("tokens", "'tokens' is required"));
    }
    Ok(DetokenizeRequest {
        model,
        tokens: opt_u32_list(&obj, "tokens")?,
    })
}

pub fn tokenize_response(tokens: &[u32], max_model_len: u32, token_strs: Option<Vec<String>>) -> Vec<u8> {
    let body = json!({
        "count": tokens.len(),
        "max_model_len": max_model_len,
        "tokens": tokens,
        "token_strs": token_strs.map(Value::from),
    });
    serde_json::to_vec(&body).expect("tokenize JSON serializes")
}

pub fn detokenize_response(text: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"prompt": text})).expect("detokenize JSON serializes")
}
