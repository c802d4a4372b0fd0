//! OpenAI response objects: `chat.completion` / `text_completion` JSON and their streamed chunks as
//! server-sent events.

use serde::Serialize;
use serde_json::{json, Value};

use super::request::Api;
use crate::error::ApiError;

/// Identity shared by every object of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

impl Usage {
    pub fn to_value(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// One tool call of an answer: `function.arguments` is the arguments' JSON object as a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    fn to_value(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// A chat message split by an output parser: reasoning, content and tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    /// The model's output is parsed for reasoning: the message carries `reasoning_content` (null when
    /// there was none).
    pub reasoning_parsed: bool,
}

/// One choice of a non-streamed answer; `logprobs` is `null` unless asked for. `parsed`: a chat choice
/// whose output went through a parser (`text` is then unused).
pub fn choice_value(
    meta: &ResponseMeta,
    index: u32,
    text: &str,
    parsed: Option<&ParsedMessage>,
    finish_reason: &str,
    logprobs: Value,
) -> Value {
    match (meta.api, parsed) {
        (Api::Chat, None) => json!({
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }),
        (Api::Chat, Some(parsed)) => json!({
            "index": index,
            "message": parsed_message(parsed),
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }),
        (Api::Completion, _) => {
            json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason})
        }
    }
}

/// The assistant message of a parsed choice: content null when the model only called tools; reasoning
/// under both `reasoning_content` (DeepSeek's and vLLM's name) and `reasoning` (vLLM's newer one).
fn parsed_message(parsed: &ParsedMessage) -> Value {
    let content = if parsed.content.is_empty() && !parsed.tool_calls.is_empty() {
        Value::Null
    } else {
        parsed.content.as_str().into()
    };
    let mut message = json!({"role": "assistant", "content": content});
    if parsed.reasoning_parsed || !parsed.reasoning.is_empty() {
        let reasoning = if parsed.reasoning.is_empty() {
            Value::Null
        } else {
            parsed.reasoning.as_str().into()
        };
        message["reasoning_content"] = reasoning.clone();
        message["reasoning"] = reasoning;
    }
    if !parsed.tool_calls.is_empty() {
        message["tool_calls"] = parsed.tool_calls.iter().map(ToolCall::to_value).collect();
    }
    message
}

/// One entry of a streamed delta's `tool_calls`: a call's start (index, id, type and name, empty
/// arguments) or a fragment of its arguments (index only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCallDelta<'a> {
    Start { index: u32, id: &'a str, name: &'a str },
    Arguments { index: u32, fragment: &'a str },
}

impl ToolCallDelta<'_> {
    /// As JSON: the start `{"index", "id", "type", "function": {"name", "arguments": ""}}`, a fragment
    /// `{"index", "function": {"arguments"}}`.
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"index\":");
        match self {
            ToolCallDelta::Start { index, id, name } => {
                out.extend_from_slice(index.to_string().as_bytes());
                out.extend_from_slice(b",\"id\":");
                json_str(id, out);
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                json_str(name, out);
                out.extend_from_slice(b",\"arguments\":\"\"}}");
            }
            ToolCallDelta::Arguments { index, fragment } => {
                out.extend_from_slice(index.to_string().as_bytes());
                out.extend_from_slice(b",\"function\":{\"arguments\":");
                json_str(fragment, out);
                out.extend_from_slice(b"}}");
            }
        }
    }
}

/// The whole non-streamed answer: its choices (in index order) and usage over all of them.
pub fn completion_json(meta: &ResponseMeta, choices: Vec<Value>, usage: Usage) -> Vec<u8> {
    let mut body = meta.envelope(false, Value::Array(choices));
    body["usage"] = usage.to_value();
    serde_json::to_vec(&body).expect("response JSON serializes")
}

fn event<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, value).expect("event JSON serializes");
    out.extend_from_slice(b"\n\n");
}

/// What one streamed chunk says about one choice.
#[derive(Debug, Default)]
pub struct Delta<'a> {
    pub text: Option<&'a str>,
    /// Chat: reasoning text, sent as `reasoning_content` and `reasoning`.
    pub reasoning: Option<&'a str>,
    /// Chat: one tool call's start or arguments fragment.
    pub tool_call: Option<ToolCallDelta<'a>>,
    /// Chat: the first chunk of a choice names the assistant role.
    pub role: bool,
    pub finish_reason: Option<&'a str>,
    /// `null` unless logprobs were asked for.
    pub logprobs: Value,
}

/// One streamed chunk carrying one choice (as vLLM streams `n` choices: one per event). A stream writes
/// one per token, so the event is written straight into `out`, with no JSON tree built and dropped per
/// token: the bytes are those of serializing the equivalent `serde_json::Value` (keys in this order,
/// compact), which the tests check against `json!`.
pub fn chunk_event(meta: &ResponseMeta, index: u32, delta: Delta<'_>, out: &mut Vec<u8>) {
    // Room for a usual token's event at once (an empty `out` would grow 8, 16, ... 256 bytes).
    out.reserve(CHUNK_EVENT_BYTES + delta.text.map_or(0, str::len));
    out.extend_from_slice(b"data: {\"id\":");
    json_str(&meta.id, out);
    out.extend_from_slice(b",\"object\":\"");
    out.extend_from_slice(meta.object(true).as_bytes());
    out.extend_from_slice(b"\",\"created\":");
    out.extend_from_slice(meta.created.to_string().as_bytes());
    out.extend_from_slice(b",\"model\":");
    json_str(&meta.model, out);
    out.extend_from_slice(b",\"choices\":[{\"index\":");
    out.extend_from_slice(index.to_string().as_bytes());
    match meta.api {
        Api::Chat => {
            out.extend_from_slice(b",\"delta\":{");
            let mut fields = Fields::default();
            if delta.role {
                fields.key("role", out);
                out.extend_from_slice(b"\"assistant\"");
            }
            if let Some(text) = delta.text {
                fields.key("content", out);
                json_str(text, out);
            }
            if let Some(reasoning) = delta.reasoning {
                fields.key("reasoning_content", out);
                json_str(reasoning, out);
                fields.key("reasoning", out);
                json_str(reasoning, out);
            }
            if let Some(call) = &delta.tool_call {
                fields.key("tool_calls", out);
                out.push(b'[');
                call.write(out);
                out.push(b']');
            }
            out.push(b'}');
        }
        Api::Completion => {
            out.extend_from_slice(b",\"text\":");
            json_str(delta.text.unwrap_or(""), out);
        }
    }
    out.extend_from_slice(b",\"logprobs\":");
    serde_json::to_writer(&mut *out, &delta.logprobs).expect("logprobs JSON serializes");
    out.extend_from_slice(b",\"finish_reason\":");
    match delta.finish_reason {
        Some(reason) => json_str(reason, out),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b"}]}\n\n");
}

/// About a one-token chat chunk's event with a 40-character id and a short model name.
const CHUNK_EVENT_BYTES: usize = 256;

/// `s` as a JSON string (quoted, escaped as serde_json escapes).
fn json_str(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, s).expect("a string serializes");
}

/// The keys of one JSON object being written: a comma before every key but the first.
#[derive(Default)]
struct Fields {
    started: bool,
}

impl Fields {
    fn key(&mut self, name: &str, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.started, true) {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
    }
}

/// Chat streams open each choice with the assistant role (completions have no such event).
pub fn start_event(meta: &ResponseMeta, index: u32, out: &mut Vec<u8>) {
    if meta.api == Api::Chat {
        let delta = Delta {
            text: Some(""),
            role: true,
            ..Delta::default()
        };
        chunk_event(meta, index, delta, out);
    }
}

/// The final usage-only chunk (`stream_options.include_usage`).
pub fn usage_event(meta: &ResponseMeta, usage: Usage, out: &mut Vec<u8>) {
    let mut value = meta.envelope(true, json!([]));
    value["usage"] = usage.to_value();
    event(&value, out);
}

/// An error in the middle of a stream, once the 200 status is gone: an event carrying the error object.
pub fn error_event(error: &ApiError, out: &mut Vec<u8>) {
    event(&error.to_value(), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(api: Api) -> ResponseMeta {
        ResponseMeta {
            api,
            id: "x-1".into(),
            created: 7,
            model: "m".into(),
        }
    }

    fn parse_event(bytes: &[u8]) -> Value {
        let text = std::str::from_utf8(bytes).unwrap();
        assert!(text.starts_with("data: {") && text.ends_with("}\n\n"));
        serde_json::from_str(text.trim_start_matches("data: ").trim()).unwrap()
    }

    #[test]
    fn chat_completion_has_openai_shape() {
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
        };
        let m = meta(Api::Chat);
        let choices = vec![choice_value(&m, 0, "hi", None, "stop", Value::Null)];
        let v: Value = serde_json::from_slice(&completion_json(&m, choices, usage)).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }

    #[test]
    fn text_completion_has_openai_shape() {
        let m = meta(Api::Completion);
        let choices = vec![choice_value(&m, 0, "hi", None, "length", Value::Null)];
        let v: Value = serde_json::from_slice(&completion_json(&m, choices, Usage::default())).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "hi");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn chat_events_carry_deltas() {
        let mut out = Vec::new();
        start_event(&meta(Api::Chat), 2, &mut out);
        let v = parse_event(&out);
        assert_eq!(v["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(v["choices"][0]["index"], 2);
        out.clear();
        let text = Delta {
            text: Some("a"),
            ..Delta::default()
        };
        chunk_event(&meta(Api::Chat), 1, text, &mut out);
        let v = parse_event(&out);
        assert_eq!(v["choices"][0]["delta"], json!({"content": "a"}));
        assert_eq!(v["choices"][0]["index"], 1);
        assert!(v["choices"][0]["finish_reason"].is_null());
        out.clear();
        let end = Delta {
            finish_reason: Some("stop"),
            ..Delta::default()
        };
        chunk_event(&meta(Api::Chat), 0, end, &mut out);
        let v = parse_event(&out);
        assert_eq!(v["choices"][0]["delta"], json!({}));
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }

    /// The chunk as a JSON tree, as `chunk_event` once built it: its bytes are the reference.
    fn reference_chunk(meta: &ResponseMeta, index: u32, delta: &Delta<'_>) -> Vec<u8> {
        let choice = match meta.api {
            Api::Chat => {
                let mut content = serde_json::Map::new();
                if delta.role {
                    content.insert("role".into(), "assistant".into());
                }
                if let Some(text) = delta.text {
                    content.insert("content".into(), text.into());
                }
                if let Some(reasoning) = delta.reasoning {
                    content.insert("reasoning_content".into(), reasoning.into());
                    content.insert("reasoning".into(), reasoning.into());
                }
                let call = match &delta.tool_call {
                    Some(ToolCallDelta::Start { index, id, name }) => Some(json!({
                        "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""},
                    })),
                    Some(ToolCallDelta::Arguments { index, fragment }) => {
                        Some(json!({"index": index, "function": {"arguments": fragment}}))
                    }
                    None => None,
                };
                if let Some(call) = call {
                    content.insert("tool_calls".into(), json!([call]));
                }
                json!({"index": index, "delta": content, "logprobs": delta.logprobs, "finish_reason": delta.finish_reason})
            }
            Api::Completion => json!({
                "index": index,
                "text": delta.text.unwrap_or(""),
                "logprobs": delta.logprobs,
                "finish_reason": delta.finish_reason,
            }),
        };
        let mut out = Vec::new();
        event(&meta.envelope(true, json!([choice])), &mut out);
        out
    }

    #[test]
    fn chunks_are_written_byte_for_byte_as_their_json_tree_serializes() {
        let odd = ResponseMeta {
            api: Api::Chat,
            id: "chatcmpl-\"q\"\\é\u{1}".into(),
            created: u64::MAX,
            model: "m/ünï \"x\"".into(),
        };
        let text = "a \"quoted\" \\ line\nbreak\t tab \u{7} bell é 日本 ✓ </tool_call>";
        let deltas = [
            Delta {
                text: Some(""),
                role: true,
                ..Delta::default()
            },
            Delta {
                text: Some(text),
                ..Delta::default()
            },
            Delta {
                reasoning: Some(text),
                ..Delta::default()
            },
            Delta {
                text: Some("t"),
                reasoning: Some("r"),
                finish_reason: Some("stop"),
                ..Delta::default()
            },
            Delta {
                tool_call: Some(ToolCallDelta::Start {
                    index: 3,
                    id: "call_\"x",
                    name: "get_weather",
                }),
                ..Delta::default()
            },
            Delta {
                tool_call: Some(ToolCallDelta::Arguments {
                    index: 0,
                    fragment: r#"{"city":"Pa\"ris"#,
                }),
                ..Delta::default()
            },
            Delta {
                finish_reason: Some("tool_calls"),
                ..Delta::default()
            },
            Delta {
                text: Some("x"),
                logprobs: json!({"content": [{"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": []}]}),
                ..Delta::default()
            },
            Delta::default(),
        ];
        for api in [Api::Chat, Api::Completion] {
            for m in [meta(api), ResponseMeta { api, ..odd.clone() }] {
                for (i, delta) in deltas.iter().enumerate() {
                    let mut out = Vec::new();
                    let copy = Delta {
                        tool_call: delta.tool_call.clone(),
                        logprobs: delta.logprobs.clone(),
                        ..*delta
                    };
                    chunk_event(&m, i as u32 * 7, copy, &mut out);
                    let expected = reference_chunk(&m, i as u32 * 7, delta);
                    assert_eq!(String::from_utf8(out).unwrap(), String::from_utf8(expected).unwrap());
                }
            }
        }
    }

    #[test]
    fn completion_events_carry_text() {
        let mut out = Vec::new();
        start_event(&meta(Api::Completion), 0, &mut out);
        assert!(out.is_empty());
        let text = Delta {
            text: Some("a"),
            ..Delta::default()
        };
        chunk_event(&meta(Api::Completion), 0, text, &mut out);
        let v = parse_event(&out);
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "a");
    }
}
