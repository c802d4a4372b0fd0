//! `POST /v1/chat/completions` and `POST /v1/completions` requests: parsed, validated, ready for the
//! template and the engine.

use serde_json::{Map, Value};

use super::fields::{opt_bool, opt_f32, opt_int, opt_object, opt_str, opt_str_or_list, opt_u32_list, Object};
use super::structured::parse_constraint;
pub use super::structured::{Constraint, ToolChoice};
use super::tools::{forced_tool_schema, parse_tool_request};
use super::unsupported::refuse_unimplemented;
use crate::error::ApiError;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i32>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub logit_bias: Vec<(i32, f32)>,
    /// Choices to generate (the engine samples them all from one prompt).
    pub n: u32,
    /// Logprobs per output token with this many top alternatives; `None` for no logprobs.
    pub logprobs: Option<u32>,
}

/// The most top alternatives per token a client may ask for (vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// The most choices per request (OpenAI's limit).
pub const MAX_N: i64 = 128;
/// Stop strings are matched against every output delta: caps on how many and how long keep that cheap
/// (a 4 MB stop string made each delta a 4 MB scan; OpenAI itself takes at most 4).
pub const MAX_STOP_STRINGS: usize = 64;
pub const MAX_STOP_STRING_BYTES: usize = 1024;
/// Each sampled token is looked up in the request's stop token ids.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// vLLM's threshold below which a temperature means greedy sampling.
const GREEDY_TEMPERATURE: f32 = 1e-5;

/// Which API the request came in on; it shapes the response objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completion,
}

/// A chat conversation, as the chat template sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatInput {
    /// Messages with text content parts joined into one string.
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    /// vLLM's `documents` (retrieval templates): a list of objects, the template's `documents` variable
    /// (boxed: rarely given, and the chat variant of the prompt enums stays small).
    pub documents: Option<Box<Value>>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub chat_template_kwargs: Map<String, Value>,
    /// vLLM's `include_reasoning` (default true): false leaves the parsed reasoning out of the answer.
    pub include_reasoning: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Chat(ChatInput),
    Text(String),
    Tokens(Vec<u32>),
    /// Completions: several prompts (each `Text` or `Tokens`), answered together.
    Batch(Vec<PromptInput>),
}

/// The most prompts one completions request may batch.
pub const MAX_BATCH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    pub api: Api,
    pub model: String,
    pub input: PromptInput,
    pub stream: bool,
    pub include_usage: bool,
    /// Completions: return the prompt's text before the generated text.
    pub echo: bool,
    pub include_stop_str_in_output: bool,
    /// The end user's id: routes a user's requests to the same engine under consistent hashing.
    pub user: Option<String>,
    pub sampling: Sampling,
    /// Chat: which tool calls the model may or must make (`Auto` when tools are given, else `None`).
    pub tool_choice: ToolChoice,
    /// Chat: whether the model may make several tool calls in one turn (OpenAI's default: true).
    pub parallel_tool_calls: bool,
    /// The one constraint on the output, if any: from `response_format`, `structured_outputs`,
    /// `guided_*`, or a forced `tool_choice` (then a JSON schema of the call(s)).
    pub constraint: Option<Constraint>,
}

impl GenerationRequest {
    pub fn chat(&self) -> Option<&ChatInput> {
        match &self.input {
            PromptInput::Chat(chat) => Some(chat),
            _ => None,
        }
    }
}

pub(crate) fn parse_object(body: &[u8]) -> Result<Object, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}")))?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::invalid("request body must be a JSON object")),
    }
}

/// Fields every generation API shares.
fn parse_common(obj: &Object, api: Api, input: PromptInput) -> Result<GenerationRequest, ApiError> {
    let model = opt_str(obj, "model")?
        .ok_or_else(|| ApiError::invalid_param("model", "'model' is required"))?
        .to_string();
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match opt_object(obj, "stream_options")? {
        Some(options) => opt_bool(options, "include_usage")
            .map_err(|_| ApiError::invalid_param("stream_options.include_usage", "must be a boolean"))?
            .unwrap_or(false),
        None => false,
    };
    let mut sampling = parse_sampling(obj)?;
    sampling.n = opt_int(obj, "n", 1, MAX_N)?.unwrap_or(1) as u32;
    if sampling.n > 1 && sampling.temperature.is_some_and(|t| t < GREEDY_TEMPERATURE) {
        return Err(ApiError::invalid_param(
            "n",
            format!(
                "n must be 1 when using greedy sampling (temperature 0), got {}",
                sampling.n
            ),
        ));
    }
    sampling.logprobs = parse_logprobs(obj, api)?;
    let echo = api == Api::Completion && opt_bool(obj, "echo")?.unwrap_or(false);
    if echo && sampling.logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "echo with logprobs (prompt logprobs) is not supported",
        ));
    }
    let (tool_choice, parallel_tool_calls, forced) = if api == Api::Chat {
        let tools = parse_tool_request(obj)?;
        let forced = forced_tool_schema(&tools)?;
        (tools.choice, tools.parallel_tool_calls, forced)
    } else {
        (ToolChoice::None, true, None)
    };
    let constraint = parse_constraint(obj, forced)?;
    refuse_unimplemented(obj, api, sampling.n)?;
    Ok(GenerationRequest {
        api,
        model,
        input,
        stream,
        include_usage,
        echo,
        include_stop_str_in_output: opt_bool(obj, "include_stop_str_in_output")?.unwrap_or(false),
        user: opt_str(obj, "user")?.map(str::to_string),
        sampling,
        tool_choice,
        parallel_tool_calls,
        constraint,
    })
}

/// Chat: `logprobs: bool` and `top_logprobs: 0..=20`; completions: `logprobs: 0..=20`.
fn parse_logprobs(obj: &Object, api: Api) -> Result<Option<u32>, ApiError> {
    match api {
        Api::Chat => {
            let wanted = opt_bool(obj, "logprobs")?.unwrap_or(false);
            let top = opt_int(obj, "top_logprobs", 0, MAX_TOP_LOGPROBS)?;
            match (wanted, top) {
                (false, Some(_)) => Err(ApiError::invalid_param(
                    "top_logprobs",
                    "when using 'top_logprobs', 'logprobs' must be set to true",
                )),
                (false, None) => Ok(None),
                (true, top) => Ok(Some(top.unwrap_or(0) as u32)),
            }
        }
        Api::Completion => Ok(opt_int(obj, "logprobs", 0, MAX_TOP_LOGPROBS)?.map(|k| k as u32)),
    }
}

pub fn parse_chat_request(body: &[u8]) -> Result<GenerationRequest, ApiError> {
    let obj = parse_object(body)?;
    let input = PromptInput::Chat(parse_chat_input(&obj)?);
    parse_common(&obj, Api::Chat, input)
}

pub fn parse_completion_request(body: &[u8]) -> Result<GenerationRequest, ApiError> {
    let obj = parse_object(body)?;
    let mut prompts = parse_prompts(&obj)?;
    // An empty text prompt would reach the engine, which has nothing to generate from.
    if let Some(i) = prompts
        .iter()
        .position(|p| matches!(p, PromptInput::Text(t) if t.is_empty()))
    {
        let which = if prompts.len() == 1 {
            String::new()
        } else {
            format!(" (prompt {i})")
        };
        return Err(ApiError::invalid_param(
            "prompt",
            format!("'prompt' must not be empty{which}"),
        ));
    }
    let input = if prompts.len() == 1 {
        prompts.remove(0)
    } else {
        if opt_bool(&obj, "stream")?.unwrap_or(false) {
            return Err(ApiError::invalid_param(
                "stream",
                "batched prompts are answered whole: send them without 'stream', or one request per prompt",
            ));
        }
        PromptInput::Batch(prompts)
    };
    parse_common(&obj, Api::Completion, input)
}

/// `prompt` for endpoints that take one: a string, token ids, or a one-element list of either.
pub(crate) fn parse_prompt(obj: &Object) -> Result<PromptInput, ApiError> {
    let mut prompts = parse_prompts(obj)?;
    if prompts.len() > 1 {
        return Err(ApiError::invalid_param("prompt", "a single prompt is expected here"));
    }
    Ok(prompts.remove(0))
}

/// `prompt`: a string, token ids, or a list of up to `MAX_BATCH` of those.
pub(crate) fn parse_prompts(obj: &Object) -> Result<Vec<PromptInput>, ApiError> {
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::invalid_param("prompt", "'prompt' is required")),
        Some(p) => p,
    };
    match prompt {
        Value::Array(items) if !items.is_empty() && (items[0].is_string() || items[0].is_array()) => {
            if items.len() > MAX_BATCH {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("at most {MAX_BATCH} prompts per request, got {}", items.len()),
                ));
            }
            items.iter().map(one_prompt).collect()
        }
        other => Ok(vec![one_prompt(other)?]),
    }
}

fn one_prompt(single: &Value) -> Result<PromptInput, ApiError> {
    let invalid = || {
        ApiError::invalid_param(
            "prompt",
            "'prompt' must be a string, a list of token ids, or a list of those",
        )
    };
    match single {
        Value::String(text) => Ok(PromptInput::Text(text.clone())),
        Value::Array(ids) if !ids.is_empty() => ids
            .iter()
            .map(|id| {
                id.as_u64()
                    .filter(|&n| n <= u32::MAX as u64)
                    .map(|n| n as u32)
                    .ok_or_else(invalid)
            })
            .collect::<Result<Vec<u32>, _>>()
            .map(PromptInput::Tokens),
        Value::Array(_) => Err(ApiError::invalid_param("prompt", "'prompt' must not be empty")),
        _ => Err(invalid()),
    }
}

pub(crate) fn parse_chat_input(obj: &Object) -> Result<ChatInput, ApiError> {
    let messages = parse_messages(obj)?;
    let continue_final_message = opt_bool(obj, "continue_final_message")?.unwrap_or(false);
    let add_generation_prompt = opt_bool(obj, "add_generation_prompt")?.unwrap_or(!continue_final_message);
    if continue_final_message && add_generation_prompt {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "continue_final_message and add_generation_prompt cannot both be true",
        ));
    }
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(tools @ Value::Array(_)) => Some(tools.clone()),
        Some(_) => {
            return Err(ApiError::invalid_param("tools", "'tools' must be a list").with_code(super::codes::INVALID_TYPE))
        }
    };
    let documents = match obj.get("documents") {
        None | Some(Value::Null) => None,
        Some(Value::Array(docs)) if docs.iter().all(Value::is_object) => Some(Box::new(Value::Array(docs.clone()))),
        Some(_) => {
            return Err(
                ApiError::invalid_param("documents", "'documents' must be a list of objects")
                    .with_code(super::codes::INVALID_TYPE),
            )
        }
    };
    let mut chat_template_kwargs = opt_object(obj, "chat_template_kwargs")?.cloned().unwrap_or_default();
    apply_reasoning_effort(obj, &mut chat_template_kwargs)?;
    Ok(ChatInput {
        messages,
        tools,
        documents,
        add_generation_prompt,
        continue_final_message,
        chat_template_kwargs,
        include_reasoning: opt_bool(obj, "include_reasoning")?.unwrap_or(true),
    })
}

/// vLLM's `reasoning_effort` reaches the chat template as the `reasoning_effort` variable (gpt-oss
/// templates read it) and, unless the client set `enable_thinking` itself, as `enable_thinking` (false
/// for "none"), as vLLM renders it.
fn apply_reasoning_effort(obj: &Object, kwargs: &mut Map<String, Value>) -> Result<(), ApiError> {
    const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];
    let Some(effort) = opt_str(obj, "reasoning_effort")? else {
        return Ok(());
    };
    if !EFFORTS.contains(&effort) {
        return Err(ApiError::invalid_param(
            "reasoning_effort",
            format!("'reasoning_effort' must be one of {EFFORTS:?}, got '{effort}'"),
        )
        .with_code(super::codes::INVALID_VALUE));
    }
    kwargs.insert("reasoning_effort".into(), Value::String(effort.into()));
    kwargs.entry("enable_thinking").or_insert(Value::Bool(effort != "none"));
    Ok(())
}

fn parse_sampling(obj: &Object) -> Result<Sampling, ApiError> {
    let max_tokens = match opt_int(obj, "max_completion_tokens", 1, u32::MAX as i64)? {
        Some(n) => Some(n),
        None => opt_int(obj, "max_tokens", 1, u32::MAX as i64)?,
    };
    let min_tokens = opt_int(obj, "min_tokens", 0, u32::MAX as i64)?.unwrap_or(0) as u32;
    if let Some(max) = max_tokens {
        if i64::from(min_tokens) > max {
            return Err(ApiError::invalid_param(
                "min_tokens",
                format!("'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({max})"),
            ));
        }
    }
    let stop = opt_str_or_list(obj, "stop")?;
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_param("stop", "stop strings must not be empty"));
    }
    check_stop_caps(&stop)?;
    let stop_token_ids = opt_u32_list(obj, "stop_token_ids")?;
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(ApiError::invalid_param(
            "stop_token_ids",
            format!(
                "at most {MAX_STOP_TOKEN_IDS} stop token ids, got {}",
                stop_token_ids.len()
            ),
        ));
    }
    Ok(Sampling {
        max_tokens: max_tokens.map(|n| n as u32),
        min_tokens,
        temperature: opt_f32(obj, "temperature", 0.0, 2.0)?,
        top_p: opt_f32(obj, "top_p", f64::MIN_POSITIVE, 1.0)?,
        top_k: opt_int(obj, "top_k", -1, i32::MAX as i64)?.map(|k| k as i32),
        min_p: opt_f32(obj, "min_p", 0.0, 1.0)?,
        presence_penalty: opt_f32(obj, "presence_penalty", -2.0, 2.0)?,
        frequency_penalty: opt_f32(obj, "frequency_penalty", -2.0, 2.0)?,
        repetition_penalty: opt_f32(obj, "repetition_penalty", f64::MIN_POSITIVE, 2.0)?,
        seed: opt_int(obj, "seed", i32::MIN as i64, i32::MAX as i64)?.map(|s| s as i32),
        stop,
        stop_token_ids,
        ignore_eos: opt_bool(obj, "ignore_eos")?.unwrap_or(false),
        skip_special_tokens: opt_bool(obj, "skip_special_tokens")?.unwrap_or(true),
        logit_bias: parse_logit_bias(obj)?,
        n: 1,
        logprobs: None,
    })
}

/// At most `MAX_STOP_STRINGS` stop strings of at most `MAX_STOP_STRING_BYTES` bytes each.
fn check_stop_caps(stop: &[String]) -> Result<(), ApiError> {
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid_param(
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings, got {}", stop.len()),
        ));
    }
    match stop.iter().map(String::len).max() {
        Some(longest) if longest > MAX_STOP_STRING_BYTES => Err(ApiError::invalid_param(
            "stop",
            format!("stop strings must be at most {MAX_STOP_STRING_BYTES} bytes long, got one of {longest} bytes"),
        )),
        _ => Ok(()),
    }
}

/// `{"token id": bias}` with biases in [-100, 100], as OpenAI defines it.
fn parse_logit_bias(obj: &Object) -> Result<Vec<(i32, f32)>, ApiError> {
    let Some(map) = opt_object(obj, "logit_bias")? else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(key, value)| {
            let id = key.parse::<i32>().ok().filter(|&id| id >= 0).ok_or_else(|| {
                ApiError::invalid_param("logit_bias", format!("logit_bias keys must be token ids, got '{key}'"))
            })?;
            let bias = value.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("logit_bias for token {id} must be between -100 and 100"),
                )
            })?;
            Ok((id, bias as f32))
        })
        .collect()
}

fn parse_messages(obj: &Object) -> Result<Vec<Value>, ApiError> {
    let list = match obj.get("messages") {
        None | Some(Value::Null) => return Err(ApiError::invalid_param("messages", "'messages' is required")),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid_param("messages", "'messages' must be a list")),
    };
    if list.is_empty() {
        return Err(ApiError::invalid_param("messages", "'messages' must not be empty"));
    }
    list.iter().enumerate().map(|(i, m)| normalize_message(i, m)).collect()
}

fn normalize_message(index: usize, message: &Value) -> Result<Value, ApiError> {
    let param = format!("messages[{index}]");
    let mut message = message
        .as_object()
        .cloned()
        .ok_or_else(|| ApiError::invalid_param(&param, format!("{param} must be an object")))?;
    match message.get("role") {
        Some(Value::String(_)) => {}
        _ => {
            return Err(ApiError::invalid_param(
                &format!("{param}.role"),
                format!("{param}.role must be a string"),
            ))
        }
    }
    let content_param = format!("{param}.content");
    let content = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(_)) => None, // kept as is
        Some(Value::Array(parts)) => Some(join_text_parts(parts, &content_param)?),
        Some(_) => {
            return Err(ApiError::invalid_param(
                &content_param,
                format!("{content_param} must be a string or a list of parts"),
            ))
        }
    };
    if let Some(text) = content {
        message.insert("content".into(), Value::String(text));
    }
    Ok(Value::Object(message))
}

/// Text parts joined with newlines (what vLLM does for "string"-format templates).
fn join_text_parts(parts: &[Value], param: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        let kind = part.get("type").and_then(Value::as_str);
        match (kind, part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(text)) => texts.push(text),
            (Some("text"), None) => return Err(ApiError::invalid_param(param, "a text part needs a 'text' string")),
            (Some(other), _) => {
                return Err(ApiError::invalid_param(
                    param,
                    format!("content parts of type '{other}' are not supported"),
                ))
            }
            (None, _) => return Err(ApiError::invalid_param(param, "each content part needs a 'type'")),
        }
    }
    Ok(texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> ApiError {
        parse_chat_request(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn parses_a_minimal_request_with_defaults() {
        let r = parse_chat_request(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(r.model, "m");
        assert!(!r.stream && r.chat().unwrap().add_generation_prompt && r.sampling.skip_special_tokens);
        assert_eq!(r.sampling.max_tokens, None);
    }

    #[test]
    fn an_open_lower_bound_reads_as_greater_than_zero() {
        let e = err(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1.5}"#);
        assert_eq!(e.message, "'top_p' must be greater than 0 and at most 1, got 1.5");
    }

    #[test]
    fn rejects_bad_input_naming_the_parameter() {
        let cases = [
            ("{", None),
            ("[]", None),
            (r#"{"messages":[{"role":"user","content":"x"}]}"#, Some("model")),
            (r#"{"model":"m"}"#, Some("messages")),
            (r#"{"model":"m","messages":[]}"#, Some("messages")),
            (r#"{"model":"m","messages":"hi"}"#, Some("messages")),
            (
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                Some("messages[0].role"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                Some("messages[0].content"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                Some("temperature"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                Some("temperature"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                Some("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#,
                Some("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                Some("stream"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0}"#,
                Some("top_p"),
            ),
        ];
        for (body, param) in cases {
            let e = err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}");
        }
    }

    #[test]
    fn joins_text_parts_and_reads_stream_options() {
        let r = parse_chat_request(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7,
                "messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.chat().unwrap().messages[0]["content"], "a\nb");
        assert!(r.stream && r.include_usage);
        assert_eq!(r.sampling.max_tokens, Some(7));
    }

    #[test]
    fn completion_prompts_in_every_accepted_shape() {
        let parse = |p: &str| parse_completion_request(format!(r#"{{"model":"m","prompt":{p}}}"#).as_bytes());
        assert_eq!(parse(r#""hi""#).unwrap().input, PromptInput::Text("hi".into()));
        assert_eq!(parse(r#"["hi"]"#).unwrap().input, PromptInput::Text("hi".into()));
        assert_eq!(parse("[1, 2]").unwrap().input, PromptInput::Tokens(vec![1, 2]));
        assert_eq!(parse("[[1, 2]]").unwrap().input, PromptInput::Tokens(vec![1, 2]));
        assert_eq!(
            parse(r#"["a", [3]]"#).unwrap().input,
            PromptInput::Batch(vec![PromptInput::Text("a".into()), PromptInput::Tokens(vec![3])])
        );
        let too_many = format!("[{}]", vec![r#""x""#; MAX_BATCH + 1].join(","));
        for bad in [
            "5",
            "[]",
            "[-1]",
            r#"["a", 5]"#,
            r#"["a", []]"#,
            r#""""#,
            r#"[""]"#,
            r#"["a", ""]"#,
            "null",
            "{}",
            &too_many,
        ] {
            assert_eq!(parse(bad).unwrap_err().param.as_deref(), Some("prompt"), "{bad}");
        }
        let streamed_batch = parse_completion_request(br#"{"model":"m","prompt":["a","b"],"stream":true}"#);
        assert_eq!(streamed_batch.unwrap_err().param.as_deref(), Some("stream"));
        assert!(
            parse_completion_request(br#"{"model":"m","prompt":"x","echo":true}"#)
                .unwrap()
                .echo
        );
    }

    #[test]
    fn n_and_logprobs_are_read_and_checked() {
        let chat = |extra: &str| {
            parse_chat_request(
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{extra}}}"#).as_bytes(),
            )
        };
        let completion =
            |extra: &str| parse_completion_request(format!(r#"{{"model":"m","prompt":"x"{extra}}}"#).as_bytes());
        let r = chat(r#","n":3,"logprobs":true,"top_logprobs":5"#).unwrap();
        assert_eq!((r.sampling.n, r.sampling.logprobs), (3, Some(5)));
        let r = chat(r#","logprobs":true"#).unwrap();
        assert_eq!((r.sampling.n, r.sampling.logprobs), (1, Some(0)));
        assert_eq!(chat(r#","logprobs":false"#).unwrap().sampling.logprobs, None);
        assert_eq!(completion(r#","logprobs":0"#).unwrap().sampling.logprobs, Some(0));
        assert_eq!(
            completion(r#","logprobs":20,"n":2"#).unwrap().sampling.logprobs,
            Some(20)
        );
        let cases = [
            (chat(r#","top_logprobs":2"#), "top_logprobs"),
            (chat(r#","logprobs":false,"top_logprobs":0"#), "top_logprobs"),
            (chat(r#","logprobs":true,"top_logprobs":21"#), "top_logprobs"),
            (chat(r#","logprobs":3"#), "logprobs"),
            (chat(r#","n":0"#), "n"),
            (chat(r#","n":129"#), "n"),
            (chat(r#","n":2,"temperature":0"#), "n"),
            (completion(r#","logprobs":21"#), "logprobs"),
            (completion(r#","logprobs":true"#), "logprobs"),
            (completion(r#","logprobs":1,"echo":true"#), "echo"),
        ];
        for (result, param) in cases {
            assert_eq!(result.unwrap_err().param.as_deref(), Some(param));
        }
    }

    #[test]
    fn unknown_fields_are_ignored() {
        assert!(
            parse_chat_request(br#"{"model":"m","messages":[{"role":"user","content":"x"}],"foo":{"bar":1}}"#).is_ok()
        );
    }

    #[test]
    fn stop_strings_and_stop_token_ids_are_capped_naming_the_field_and_the_limit() {
        let chat = |extra: String| {
            parse_chat_request(
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{extra}}}"#).as_bytes(),
            )
        };
        let list = |items: Vec<String>| serde_json::to_string(&items).unwrap();
        let at_most = list((0..MAX_STOP_STRINGS).map(|i| format!("s{i}")).collect());
        assert_eq!(
            chat(format!(r#","stop":{at_most}"#)).unwrap().sampling.stop.len(),
            MAX_STOP_STRINGS
        );
        let longest = "x".repeat(MAX_STOP_STRING_BYTES);
        assert!(chat(format!(r#","stop":"{longest}""#)).is_ok());
        let too_many = list((0..=MAX_STOP_STRINGS).map(|i| format!("s{i}")).collect());
        let e = chat(format!(r#","stop":{too_many}"#)).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("stop")));
        assert!(e.message.contains(&MAX_STOP_STRINGS.to_string()), "{}", e.message);
        let e = chat(format!(r#","stop":["ok","{longest}x"]"#)).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("stop")));
        assert!(e.message.contains(&MAX_STOP_STRING_BYTES.to_string()), "{}", e.message);
        let ids = |n: usize| serde_json::to_string(&(0..n as u32).collect::<Vec<_>>()).unwrap();
        assert!(chat(format!(r#","stop_token_ids":{}"#, ids(MAX_STOP_TOKEN_IDS))).is_ok());
        let e = chat(format!(r#","stop_token_ids":{}"#, ids(MAX_STOP_TOKEN_IDS + 1))).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("stop_token_ids")));
    }
}
