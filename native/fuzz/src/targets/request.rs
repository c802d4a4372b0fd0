//! The OpenAI request parser: a request body (JSON bytes) through the chat, completions, tokenize and
//! detokenize parsers. A refusal must be a client error (4xx) whose JSON body parses; an accepted request
//! must hold the limits the parser promises (n, logprobs, batch size, min/max tokens, non-empty stops).

use extproc_core::error::ApiError;
use extproc_core::openai::request::{
    parse_chat_request, parse_completion_request, Api, GenerationRequest, PromptInput, MAX_BATCH, MAX_N,
    MAX_TOP_LOGPROBS,
};
use extproc_core::openai::tokenize::{parse_detokenize_request, parse_tokenize_request};
use serde_json::Value;

use super::{signature, Target};
use crate::json_gen;
use crate::rng::Rng;

pub const TARGET: Target = Target {
    name: "request",
    run,
    generate,
    mutate,
    dictionary: json_gen::field_tokens,
};

fn run(data: &[u8]) -> u64 {
    let chat = outcome(parse_chat_request(data), Api::Chat);
    let completion = outcome(parse_completion_request(data), Api::Completion);
    let tokenize = parse_tokenize_request(data).err().map(|e| refused(&e));
    let detokenize = parse_detokenize_request(data).err().map(|e| refused(&e));
    signature(&format!("{chat}|{completion}|{tokenize:?}|{detokenize:?}"))
}

/// A refusal's shape; panics unless it is a client error with a JSON body.
fn refused(error: &ApiError) -> String {
    assert!(
        (400..500).contains(&error.status),
        "a bad body is the client's fault: {error:?}"
    );
    let body: Value = serde_json::from_slice(&error.to_json()).expect("error bodies are JSON");
    assert!(body.get("error").is_some(), "{body}");
    format!("{}:{}", error.param.as_deref().unwrap_or(""), error.message)
}

fn outcome(parsed: Result<GenerationRequest, ApiError>, api: Api) -> String {
    let request = match parsed {
        Ok(request) => request,
        Err(error) => return refused(&error),
    };
    assert_eq!(request.api, api);
    let s = &request.sampling;
    assert!((1..=MAX_N as u32).contains(&s.n), "n {}", s.n);
    assert!(s.logprobs.is_none_or(|k| i64::from(k) <= MAX_TOP_LOGPROBS));
    assert!(s.max_tokens.is_none_or(|max| max >= 1 && s.min_tokens <= max));
    assert!(s.stop.iter().all(|stop| !stop.is_empty()));
    assert!(!(request.echo && s.logprobs.is_some()));
    match &request.input {
        PromptInput::Chat(chat) => {
            assert!(!chat.messages.is_empty());
            assert!(!(chat.add_generation_prompt && chat.continue_final_message));
            for m in &chat.messages {
                assert!(m["role"].is_string(), "{m}");
                assert!(
                    matches!(m.get("content"), None | Some(Value::Null | Value::String(_))),
                    "{m}"
                );
            }
        }
        PromptInput::Batch(prompts) => {
            assert!(prompts.len() > 1 && prompts.len() <= MAX_BATCH && !request.stream);
            assert!(prompts
                .iter()
                .all(|p| matches!(p, PromptInput::Text(_) | PromptInput::Tokens(_))));
        }
        PromptInput::Tokens(ids) => assert!(!ids.is_empty()),
        PromptInput::Text(_) => {}
    }
    format!("ok:{:?}:{}:{}", api, request.stream, request.sampling.n > 1)
}

fn generate(rng: &mut Rng) -> Vec<u8> {
    let chat = rng.one_in(2);
    serde_json::to_vec(&json_gen::request(rng, chat)).expect("JSON")
}

fn mutate(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(data).ok()?;
    for _ in 0..1 + rng.below(3) {
        json_gen::mutate_tree(rng, &mut value);
    }
    Some(serde_json::to_vec(&value).expect("JSON"))
}
