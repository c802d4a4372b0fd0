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
    fn to_value(&self) -> Value {
        match self {
            ToolCallDelta::Start { index, id, name } => json!({
                "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""},
            }),
            ToolCallDelta::Arguments { index, fragment } => {
                json!({"index": index, "function": {"arguments": fragment}})
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

/// One streamed chunk carrying one choice (as vLLM streams `n` choices: one per event). Written from
/// borrowed parts, not built as a `Value` (a chunk per token is the stream's hot path): the fields in the
/// order the envelope and the choice objects give them.
pub fn chunk_event(meta: &ResponseMeta, index: u32, delta: Delta<'_>, out: &mut Vec<u8>) {
    // Room for a usual token's event at once (an empty `out` would grow 8, 16, ... 256 bytes).
    out.reserve(CHUNK_EVENT_BYTES + delta.text.map_or(0, str::len));
    let logprobs = &delta.logprobs;
    let finish_reason = delta.finish_reason;
    match meta.api {
        Api::Chat => {
            let choice = ChatChunkChoice {
                index,
                delta: ChatChunkDelta {
                    role: delta.role.then_some("assistant"),
                    content: delta.text,
                    reasoning_content: delta.reasoning,
                    reasoning: delta.reasoning,
                    tool_calls: delta.tool_call.as_ref().map(|call| [call.to_value()]),
                },
                logprobs,
                finish_reason,
            };
            event(&meta.chunk(choice), out);
        }
        Api::Completion => {
            let choice = CompletionChunkChoice {
                index,
                text: delta.text.unwrap_or(""),
                logprobs,
                finish_reason,
            };
            event(&meta.chunk(choice), out);
        }
    }
}

/// About a one-token chat chunk's event with a 40-character id and a short model name.
const CHUNK_EVENT_BYTES: usize = 256;

/// A streamed chunk object (`envelope(true, [choice])`'s fields, borrowed).
#[derive(Serialize)]
struct Chunk<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [C; 1],
}

impl ResponseMeta {
    fn chunk<C>(&self, choice: C) -> Chunk<'_, C> {
        Chunk {
            id: &self.id,
            object: self.object(true),
            created: self.created,
            model: &self.model,
            choices: [choice],
        }
    }
}

#[derive(Serialize)]
struct ChatChunkChoice<'a> {
    index: u32,
    delta: ChatChunkDelta<'a>,
    logprobs: &'a Value,
    finish_reason: Option<&'a str>,
}

/// A chat chunk's delta: only the fields it carries.
#[derive(Serialize)]
struct ChatChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[Value; 1]>,
}

#[derive(Serialize)]
struct CompletionChunkChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: &'a Value,
    finish_reason: Option<&'a str>,
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

    /// The chunk as a `Value` (how chunks were built before they were written from borrowed parts).
    fn chunk_as_value(meta: &ResponseMeta, index: u32, delta: &Delta<'_>) -> Vec<u8> {
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
                if let Some(call) = &delta.tool_call {
                    content.insert("tool_calls".into(), json!([call.to_value()]));
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
    fn chunks_are_byte_for_byte_their_value_form() {
        let logprobs = json!({"content": [{"token": "a\"b", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]});
        let deltas = || {
            vec![
                Delta {
                    text: Some(""),
                    role: true,
                    ..Delta::default()
                },
                Delta {
                    text: Some("tab\t \"quote\" \u{1F600} \u{7f} \\ </script>"),
                    ..Delta::default()
                },
                Delta {
                    reasoning: Some("think\n"),
                    ..Delta::default()
                },
                Delta {
                    tool_call: Some(ToolCallDelta::Start {
                        index: 1,
                        id: "call_1",
                        name: "f",
                    }),
                    ..Delta::default()
                },
                Delta {
                    tool_call: Some(ToolCallDelta::Arguments {
                        index: 0,
                        fragment: "{\"a\": 1",
                    }),
                    ..Delta::default()
                },
                Delta {
                    text: Some("x"),
                    finish_reason: Some("length"),
                    logprobs: logprobs.clone(),
                    ..Delta::default()
                },
                Delta {
                    finish_reason: Some("stop"),
                    ..Delta::default()
                },
            ]
        };
        for api in [Api::Chat, Api::Completion] {
            let m = ResponseMeta {
                api,
                id: "chatcmpl-\"id\"".into(),
                created: u64::MAX,
                model: "llama/3 \u{e9}".into(),
            };
            for (index, delta) in deltas().into_iter().enumerate() {
                let expected = chunk_as_value(&m, index as u32, &delta);
                let mut out = Vec::new();
                chunk_event(&m, index as u32, delta, &mut out);
                assert_eq!(String::from_utf8(out).unwrap(), String::from_utf8(expected).unwrap());
            }
        }
    }
}
