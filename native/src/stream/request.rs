//! Client request → engine request: parse, template, tokenize, check limits, build `GenerateRequest`.

use minijinja::Value as Jinja;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::openai::request::{ChatInput, GenerationRequest, PromptInput};
use crate::pb::vllm::{GenerateRequest, SamplingParams, TokenizedInput};
use crate::template::RenderError;

/// The prompt as token ids, ready to send.
pub struct Prompt {
    pub input_ids: Vec<u32>,
}

/// The prompt of any generation request as token ids.
pub fn prompt(model: &ServedModel, request: &GenerationRequest) -> Result<Prompt, ApiError> {
    match &request.input {
        PromptInput::Chat(chat) => chat_prompt(model, chat),
        PromptInput::Text(text) => {
            let input_ids = model
                .files
                .tokenizer
                .encode_with_special_tokens(text)
                .map_err(ApiError::internal)?;
            Ok(Prompt { input_ids })
        }
        PromptInput::Tokens(ids) => {
            let vocab = model.files.tokenizer.vocab_size() as u32;
            if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token id {bad} is out of the vocabulary (size {vocab})"),
                ));
            }
            Ok(Prompt { input_ids: ids.clone() })
        }
    }
}

/// Render the chat template for `request` and tokenize the result.
pub fn chat_prompt(model: &ServedModel, request: &ChatInput) -> Result<Prompt, ApiError> {
    let template = model.files.template.as_ref().ok_or_else(|| {
        ApiError::invalid(format!(
            "model '{}' has no chat template; use /v1/completions",
            model.name
        ))
    })?;
    let mut context: Map<String, Value> = request.chat_template_kwargs.clone();
    context.insert("messages".into(), Value::Array(request.messages.clone()));
    context.insert(
        "add_generation_prompt".into(),
        Value::Bool(request.add_generation_prompt),
    );
    if let Some(tools) = &request.tools {
        context.insert("tools".into(), tools.clone());
    }
    for (key, token) in [
        ("bos_token", &model.files.bos_token),
        ("eos_token", &model.files.eos_token),
    ] {
        if let Some(token) = token {
            context.insert(key.into(), Value::String(token.clone()));
        }
    }
    let mut text = template.render(Jinja::from_serialize(&context)).map_err(|e| match e {
        RenderError::Raised(message) => ApiError::invalid_param("messages", message),
        RenderError::Failed(message) => ApiError::invalid(format!("chat template failed: {message}")),
    })?;
    if request.continue_final_message {
        text = cut_after_final_message(text, request)?;
    }
    let input_ids = model.files.tokenizer.encode(&text).map_err(ApiError::internal)?;
    Ok(Prompt { input_ids })
}

/// `continue_final_message`: the prompt ends where the last message's content ends, so the model
/// continues it instead of starting a new turn.
fn cut_after_final_message(mut text: String, request: &ChatInput) -> Result<String, ApiError> {
    let last = request
        .messages
        .last()
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let trimmed = last.trim();
    let end = text.rfind(trimmed).map(|start| start + trimmed.len()).ok_or_else(|| {
        ApiError::invalid_param(
            "continue_final_message",
            "the final message's content is not in the rendered prompt",
        )
    })?;
    text.truncate(end);
    Ok(text)
}

/// Refuse prompts the engine could not take: over the context, or leaving no room for `max_tokens`.
pub fn check_context(model: &ServedModel, prompt_len: usize, request: &GenerationRequest) -> Result<(), ApiError> {
    let sampling = &request.sampling;
    let param = if request.chat().is_some() { "messages" } else { "prompt" };
    let limit = model.max_context() as usize;
    let wanted = prompt_len + sampling.max_tokens.unwrap_or(0) as usize;
    if prompt_len >= limit || wanted > limit {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested {wanted} tokens \
                 ({prompt_len} in the prompt, {} in the completion).",
                sampling.max_tokens.unwrap_or(0)
            ),
        ));
    }
    Ok(())
}

pub fn generate_request(request_id: &str, prompt: Prompt, request: &GenerationRequest) -> GenerateRequest {
    let sampling = &request.sampling;
    // Proto3 zero values are sent only where the engine reads zero as "unset" (top_p, repetition
    // penalty) or where zero is the true default; explicit optionals carry what the client meant.
    let params = SamplingParams {
        temperature: sampling.temperature,
        top_p: sampling.top_p.unwrap_or(0.0),
        top_k: sampling.top_k.filter(|&k| k > 0).unwrap_or(0) as u32,
        min_p: sampling.min_p.unwrap_or(0.0),
        frequency_penalty: sampling.frequency_penalty.unwrap_or(0.0),
        presence_penalty: sampling.presence_penalty.unwrap_or(0.0),
        repetition_penalty: sampling.repetition_penalty.unwrap_or(0.0),
        max_tokens: sampling.max_tokens,
        min_tokens: sampling.min_tokens,
        stop: sampling.stop.clone(),
        stop_token_ids: sampling.stop_token_ids.clone(),
        skip_special_tokens: sampling.skip_special_tokens,
        spaces_between_special_tokens: true,
        ignore_eos: sampling.ignore_eos,
        n: 1,
        seed: sampling.seed,
        include_stop_str_in_output: request.include_stop_str_in_output,
        logit_bias: sampling.logit_bias.iter().copied().collect(),
    };
    GenerateRequest {
        request_id: request_id.to_string(),
        tokenized: Some(TokenizedInput {
            original_text: String::new(),
            input_ids: prompt.input_ids,
        }),
        sampling_params: Some(params),
        stream: request.stream,
    }
}
