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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::openai::request::{parse_chat_request, parse_completion_request};

    fn with(mut body: Value, extra: &Value) -> Vec<u8> {
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    }
    fn chat(extra: Value) -> Result<(), crate::error::ApiError> {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        parse_chat_request(&with(body, &extra)).map(|_| ())
    }
    fn completion(extra: Value) -> Result<(), crate::error::ApiError> {
        parse_completion_request(&with(json!({"model": "m", "prompt": "x"}), &extra)).map(|_| ())
    }

    #[test]
    fn fields_that_would_change_the_answer_are_refused_by_name() {
        let refused_chat = [
            json!({"functions": [{"name": "f"}]}),
            json!({"function_call": "auto"}),
            json!({"audio": {"voice": "alloy", "format": "wav"}}),
            json!({"modalities": ["text", "audio"]}),
            json!({"prediction": {"type": "content", "content": "x"}}),
            json!({"web_search_options": {}}),
            json!({"verbosity": "low"}),
            json!({"echo": true}),
            json!({"chat_template": "{{ messages }}"}),
            json!({"add_special_tokens": true}),
            json!({"use_beam_search": true}),
            json!({"length_penalty": 0.5}),
            json!({"spaces_between_special_tokens": false}),
            json!({"truncate_prompt_tokens": 5}),
            json!({"prompt_logprobs": 0}),
            json!({"allowed_token_ids": [1]}),
            json!({"bad_words": ["x"]}),
            json!({"return_tokens_as_token_ids": true}),
            json!({"cache_salt": "s"}),
            json!({"kv_transfer_params": {}}),
            json!({"vllm_xargs": {"a": 1}}),
            json!({"guided_whitespace_pattern": " "}),
            json!({"best_of": 2}),
            json!({"stream": true, "stream_options": {"continuous_usage_stats": true}}),
        ];
        for extra in refused_chat {
            let name = extra.as_object().unwrap().keys().next_back().unwrap().clone();
            let e = chat(extra.clone()).unwrap_err();
            let param = e.param.clone().unwrap();
            assert!(param.starts_with(&name), "{extra}: {param}");
            assert!(
                matches!(e.code, Some("unsupported_parameter" | "unsupported_value")),
                "{extra}: {e:?}"
            );
        }
        for (extra, param) in [
            (json!({"suffix": "end"}), "suffix"),
            (json!({"best_of": 3, "n": 2}), "best_of"),
            (json!({"add_special_tokens": false}), "add_special_tokens"),
            (json!({"prompt_embeds": "AAAA"}), "prompt_embeds"),
        ] {
            assert_eq!(
                completion(extra.clone()).unwrap_err().param.as_deref(),
                Some(param),
                "{extra}"
            );
        }
    }

    #[test]
    fn defaults_and_fields_that_do_not_change_the_answer_are_accepted() {
        for extra in [
            json!({"metadata": {"a": "b"}, "store": false, "service_tier": "auto", "user": "u",
                   "prompt_cache_key": "k", "safety_identifier": "s", "priority": 3, "request_id": "r"}),
            json!({"functions": [], "function_call": null, "audio": null, "modalities": ["text"]}),
            json!({"echo": false, "add_special_tokens": false, "use_beam_search": false, "length_penalty": 1.0,
                   "spaces_between_special_tokens": true, "bad_words": [], "allowed_token_ids": null}),
            json!({"best_of": 1}),
            json!({"n": 2, "best_of": 2}),
            json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": false}}),
            json!({"guided_decoding_backend": "xgrammar"}),
        ] {
            assert!(chat(extra.clone()).is_ok(), "{extra}");
        }
        // Chat-only refusals do not apply to completions, and the other way round.
        assert!(completion(json!({"echo": true, "audio": {"voice": "x"}})).is_ok());
        assert!(chat(json!({"suffix": "x", "prompt_embeds": "AAAA"})).is_ok());
        assert!(completion(json!({"suffix": ""})).is_ok());
    }

    #[test]
    fn reasoning_effort_reaches_the_template_as_vllm_renders_it() {
        let kwargs = |extra: Value| {
            let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            parse_chat_request(&with(body, &extra)).map(|r| r.chat().unwrap().chat_template_kwargs.clone())
        };
        let k = kwargs(json!({"reasoning_effort": "low"})).unwrap();
        assert_eq!(
            (k["reasoning_effort"].clone(), k["enable_thinking"].clone()),
            (json!("low"), json!(true))
        );
        let k = kwargs(json!({"reasoning_effort": "none"})).unwrap();
        assert_eq!(k["enable_thinking"], json!(false));
        let k =
            kwargs(json!({"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": false}})).unwrap();
        assert_eq!(
            (k["reasoning_effort"].clone(), k["enable_thinking"].clone()),
            (json!("high"), json!(false))
        );
        assert!(kwargs(json!({})).unwrap().is_empty());
        let e = kwargs(json!({"reasoning_effort": "extreme"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
    }
}
