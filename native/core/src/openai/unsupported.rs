//! Request fields of the OpenAI and vLLM APIs that change the answer and that the gateway does not
//! implement: given with a value other than their default, they are a 400 naming them, never a silent
//! 200 that ignored them. (Fields that do not change the answer, such as `metadata`, `store`,
//! `service_tier`, `prompt_cache_key` or `priority`, are accepted and ignored.) docs/openai.md lists both.

use serde_json::Value;

use super::codes::{refuse, UNSUPPORTED_PARAMETER, UNSUPPORTED_VALUE};
use super::fields::Object;
use super::request::Api;
use crate::error::ApiError;

/// Which API a refused field belongs to.
#[derive(Clone, Copy, PartialEq)]
enum On {
    Both,
    Chat,
    Completion,
}

/// A value of the field that asks for nothing beyond the default (JSON null always does).
#[derive(Clone, Copy)]
enum Inert {
    Nothing,
    False,
    True,
    Number(f64),
    EmptyString,
    Empty,
}

/// (field, API, its inert value, why it is refused).
const REFUSED: &[(&str, On, Inert, &str)] = &[
    (
        "suffix",
        On::Completion,
        Inert::EmptyString,
        "insertion (text after the completion) is not offered",
    ),
    (
        "functions",
        On::Chat,
        Inert::Empty,
        "the legacy function calling API is not offered: use 'tools'",
    ),
    (
        "function_call",
        On::Chat,
        Inert::Nothing,
        "the legacy function calling API is not offered: use 'tool_choice'",
    ),
    ("audio", On::Chat, Inert::Nothing, "audio output is not offered"),
    (
        "prediction",
        On::Chat,
        Inert::Nothing,
        "predicted outputs are not offered",
    ),
    (
        "web_search_options",
        On::Chat,
        Inert::Nothing,
        "web search is not offered",
    ),
    ("verbosity", On::Chat, Inert::Nothing, "'verbosity' is not offered"),
    (
        "echo",
        On::Chat,
        Inert::False,
        "echoing the last message (vLLM's chat 'echo') is not offered",
    ),
    (
        "chat_template",
        On::Chat,
        Inert::Nothing,
        "a request's own chat template is not offered",
    ),
    (
        "add_special_tokens",
        On::Chat,
        Inert::False,
        "adding special tokens to a chat prompt is not offered",
    ),
    (
        "add_special_tokens",
        On::Completion,
        Inert::True,
        "a completion prompt always gets the model's special tokens",
    ),
    ("use_beam_search", On::Both, Inert::False, "beam search is not offered"),
    (
        "length_penalty",
        On::Both,
        Inert::Number(1.0),
        "'length_penalty' (beam search) is not offered",
    ),
    (
        "spaces_between_special_tokens",
        On::Both,
        Inert::True,
        "special tokens are always detokenized with spaces between them",
    ),
    (
        "truncate_prompt_tokens",
        On::Both,
        Inert::Nothing,
        "prompt truncation is not offered",
    ),
    (
        "prompt_logprobs",
        On::Both,
        Inert::Nothing,
        "prompt logprobs are not offered",
    ),
    (
        "logprob_token_ids",
        On::Both,
        Inert::Empty,
        "logprobs of chosen token ids are not offered",
    ),
    (
        "allowed_token_ids",
        On::Both,
        Inert::Empty,
        "'allowed_token_ids' is not offered",
    ),
    ("bad_words", On::Both, Inert::Empty, "'bad_words' is not offered"),
    (
        "logits_processors",
        On::Both,
        Inert::Empty,
        "custom logits processors are not offered",
    ),
    (
        "thinking_token_budget",
        On::Both,
        Inert::Nothing,
        "a thinking token budget is not offered",
    ),
    (
        "repetition_detection",
        On::Both,
        Inert::Nothing,
        "repetition detection is not offered",
    ),
    ("watermarking", On::Both, Inert::False, "watermarking is not offered"),
    (
        "return_tokens_as_token_ids",
        On::Both,
        Inert::False,
        "tokens as token ids are not offered",
    ),
    (
        "return_token_ids",
        On::Both,
        Inert::False,
        "returning token ids is not offered",
    ),
    (
        "return_token_offsets",
        On::Both,
        Inert::False,
        "returning token offsets is not offered",
    ),
    (
        "return_prompt_text",
        On::Both,
        Inert::False,
        "returning the prompt text is not offered",
    ),
    (
        "prompt_embeds",
        On::Completion,
        Inert::Nothing,
        "prompt embeddings are not offered",
    ),
    (
        "kv_transfer_params",
        On::Both,
        Inert::Nothing,
        "disaggregated prefill parameters are not offered",
    ),
    (
        "ec_transfer_params",
        On::Both,
        Inert::Nothing,
        "encoder-cache transfer parameters are not offered",
    ),
    (
        "vllm_xargs",
        On::Both,
        Inert::Empty,
        "engine extra arguments are not passed on",
    ),
    (
        "cache_salt",
        On::Both,
        Inert::Nothing,
        "prefix-cache isolation by salt is not offered (the engines would share the cache)",
    ),
    (
        "guided_whitespace_pattern",
        On::Both,
        Inert::Nothing,
        "a JSON whitespace pattern is not offered",
    ),
];

fn is_inert(value: &Value, inert: Inert) -> bool {
    match (inert, value) {
        (_, Value::Null) => true,
        (Inert::False, Value::Bool(false)) | (Inert::True, Value::Bool(true)) => true,
        (Inert::Number(n), Value::Number(x)) => x.as_f64() == Some(n),
        (Inert::EmptyString, Value::String(s)) => s.is_empty(),
        (Inert::Empty, Value::Array(a)) => a.is_empty(),
        (Inert::Empty, Value::Object(o)) => o.is_empty(),
        _ => false,
    }
}

/// A 400 for the first field of `REFUSED` (for `api`) the request gives a value that would change the
/// answer, and for `modalities` other than text, `stream_options.continuous_usage_stats`, and
/// `best_of` other than `n`.
pub fn refuse_unimplemented(obj: &Object, api: Api, n: u32) -> Result<(), ApiError> {
    for &(name, on, inert, why) in REFUSED {
        let applies = on == On::Both || (on == On::Chat) == (api == Api::Chat);
        if applies && obj.get(name).is_some_and(|v| !is_inert(v, inert)) {
            return Err(refuse(
                name,
                UNSUPPORTED_PARAMETER,
                format!("'{name}' is not supported: {why}"),
            ));
        }
    }
    if api == Api::Chat {
        if let Some(modalities) = obj.get("modalities").filter(|v| !v.is_null()) {
            let text_only = modalities
                .as_array()
                .is_some_and(|m| m.iter().all(|x| x.as_str() == Some("text")));
            if !text_only {
                return Err(refuse(
                    "modalities",
                    UNSUPPORTED_VALUE,
                    "only the 'text' output modality is offered",
                ));
            }
        }
    }
    let continuous = obj
        .get("stream_options")
        .and_then(|o| o.get("continuous_usage_stats"))
        .is_some_and(|v| !is_inert(v, Inert::False));
    if continuous {
        return Err(refuse(
            "stream_options.continuous_usage_stats",
            UNSUPPORTED_PARAMETER,
            "usage on every streamed chunk is not offered",
        ));
    }
    if let Some(best_of) = obj.get("best_of").filter(|v| !v.is_null()) {
        if best_of.as_u64() != Some(u64::from(n)) {
            return Err(refuse(
                "best_of",
                UNSUPPORTED_VALUE,
                format!("'best_of' other than 'n' ({n}) is not supported: every sampled choice is returned"),
            ));
        }
    }
    Ok(())
}
