//! The answers the gateway gives itself, without an engine: the model list (`GET /v1/models`) and the
//! tokenizer APIs (`POST /v1/tokenize`, `POST /v1/detokenize`), as JSON bodies.

use serde_json::json;

use super::request;
use crate::auth::Grant;
use crate::error::ApiError;
use crate::gateway::{Gateway, ServedModel};
use crate::openai::tokenize::{
    detokenize_response, tokenize_response, DetokenizeRequest, TokenizeInput, TokenizeRequest,
};

/// `GET /v1/models`: every served model the API key may use (all without keys), sorted by name.
pub fn models(gateway: &Gateway, grant: Option<&Grant>) -> Vec<u8> {
    let data: Vec<_> = gateway
        .models()
        .iter()
        .filter(|m| grant.is_none_or(|g| g.allows(&m.name)))
        .map(|m| {
            json!({
                "id": m.name,
                "object": "model",
                "created": m.created,
                "owned_by": "extproc",
                "max_model_len": m.max_context(),
            })
        })
        .collect();
    serde_json::to_vec(&json!({"object": "list", "data": data})).expect("models JSON serializes")
}

/// `POST /v1/tokenize` for `model`: the prompt's (or the rendered chat's) token ids.
pub fn tokenize(model: &ServedModel, req: &TokenizeRequest) -> Result<Vec<u8>, ApiError> {
    let tokenizer = &model.files.tokenizer;
    let ids = match &req.input {
        TokenizeInput::Chat(chat) => request::chat_prompt(model, chat)?.input_ids,
        TokenizeInput::Text {
            text,
            add_special_tokens: true,
        } => tokenizer.encode_with_special_tokens(text).map_err(ApiError::internal)?,
        TokenizeInput::Text {
            text,
            add_special_tokens: false,
        } => tokenizer.encode(text).map_err(ApiError::internal)?,
    };
    let strs = req.return_token_strs.then(|| {
        ids.iter()
            .map(|&id| tokenizer.id_to_token(id).unwrap_or_default())
            .collect()
    });
    Ok(tokenize_response(&ids, model.max_context(), strs))
}

/// `POST /v1/detokenize` for `model`: the text of the token ids, which must be in its vocabulary.
pub fn detokenize(model: &ServedModel, req: &DetokenizeRequest) -> Result<Vec<u8>, ApiError> {
    request::check_token_ids(model, &req.tokens, "tokens")?;
    let text = model.files.tokenizer.decode(&req.tokens, false);
    Ok(detokenize_response(&text))
}
