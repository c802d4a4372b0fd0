//! Client request → engine request: parse, template, tokenize, check limits.

use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::openai::request::{ChatInput, GenerationRequest, PromptInput};
use crate::template::{ChatInputs, RenderError};

/// The prompt as token ids, ready to send.
pub struct Prompt {
    pub input_ids: Vec<u32>,
}

/// The prompt of any generation request but a batch, as token ids.
pub fn prompt(model: &ServedModel, input: &PromptInput) -> Result<Prompt, ApiError> {
    match input {
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
            check_token_ids(model, ids, "prompt")?;
            Ok(Prompt { input_ids: ids.clone() })
        }
        PromptInput::Batch(_) => Err(ApiError::internal("a batch has one prompt per part")),
    }
}

/// Client-given token ids must exist in the model's vocabulary; `param` names the field that held them.
pub fn check_token_ids(model: &ServedModel, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = model.files.tokenizer.vocab_size() as u32;
    match ids.iter().find(|&&id| id >= vocab) {
        Some(bad) => Err(ApiError::invalid_param(
            param,
            format!("token id {bad} is out of the vocabulary (size {vocab})"),
        )),
        None => Ok(()),
    }
}

/// Render the chat template for `request` (with `apply_chat_template`'s semantics) and tokenize it.
pub fn chat_prompt(model: &ServedModel, request: &ChatInput) -> Result<Prompt, ApiError> {
    if model.files.template.is_none() && model.files.named_templates.is_empty() {
        return Err(ApiError::invalid(format!(
            "model '{}' has no chat template; use /v1/completions",
            model.name
        )));
    }
    let inputs = ChatInputs {
        messages: &request.messages,
        tools: request.tools.as_ref(),
        documents: None,
        add_generation_prompt: request.add_generation_prompt,
        continue_final_message: request.continue_final_message.then_some("content"),
        special_tokens: None,
        kwargs: Some(&request.chat_template_kwargs),
    };
    let text = model.files.render_chat(None, inputs).map_err(|e| match e {
        RenderError::Raised(message) => ApiError::invalid_param("messages", message),
        RenderError::Failed(message) => ApiError::invalid(format!("chat template failed: {message}")),
    })?;
    let input_ids = model.files.tokenizer.encode(&text).map_err(ApiError::internal)?;
    Ok(Prompt { input_ids })
}

/// The tokens that end a choice when sampled: the request's stop token ids and, unless `ignore_eos`,
/// the model's EOS. Like vLLM, the gateway leaves such a token out of the text.
pub fn stop_token_ids(model: &ServedModel, request: &GenerationRequest) -> Vec<u32> {
    let mut ids = request.sampling.stop_token_ids.clone();
    if !request.sampling.ignore_eos {
        ids.extend(&model.files.eos_token_ids);
    }
    ids
}

/// Refuse requests the engine could not take: `logit_bias` outside the vocabulary, a prompt over the
/// context or leaving no room for `max_tokens`.
pub fn check_context(model: &ServedModel, prompt_len: usize, request: &GenerationRequest) -> Result<(), ApiError> {
    let sampling = &request.sampling;
    let vocab = model.files.tokenizer.vocab_size();
    if let Some((id, _)) = sampling.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!("logit_bias token id {id} is out of the vocabulary (size {vocab})"),
        ));
    }
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
