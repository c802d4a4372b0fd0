//! `chat.completion` JSON and `chat.completion.chunk` server-sent events.

use serde_json::{json, Value};

use crate::error::ApiError;

/// Identity shared by every object of one response.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
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

/// The whole non-streamed answer.
pub fn completion_json(meta: &ResponseMeta, text: &str, finish_reason: &str, usage: Usage) -> Vec<u8> {
    let body = json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
        "usage": usage.to_value(),
    });
    serde_json::to_vec(&body).expect("response JSON serializes")
}

fn event(value: &Value, out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, value).expect("event JSON serializes");
    out.extend_from_slice(b"\n\n");
}

/// One `chat.completion.chunk` event with a choice carrying `delta` and `finish_reason`.
pub fn chunk_event(meta: &ResponseMeta, delta: Value, finish_reason: Option<&str>, out: &mut Vec<u8>) {
    let value = json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
    });
    event(&value, out);
}

/// The final usage-only chunk (`stream_options.include_usage`).
pub fn usage_event(meta: &ResponseMeta, usage: Usage, out: &mut Vec<u8>) {
    let value = json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage.to_value(),
    });
    event(&value, out);
}

/// An error in the middle of a stream, once the 200 status is gone: an event carrying the error object.
pub fn error_event(error: &ApiError, out: &mut Vec<u8>) {
    event(&error.to_value(), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        ResponseMeta { id: "chatcmpl-1".into(), created: 7, model: "m".into() }
    }

    #[test]
    fn completion_has_openai_shape() {
        let usage = Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 1 };
        let v: Value = serde_json::from_slice(&completion_json(&meta(), "hi", "stop", usage)).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }

    #[test]
    fn events_are_sse_framed() {
        let mut out = Vec::new();
        chunk_event(&meta(), json!({"content": "a"}), None, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("data: {") && text.ends_with("}\n\n"));
        let v: Value = serde_json::from_str(text.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["choices"][0]["delta"]["content"], "a");
        assert!(v["choices"][0]["finish_reason"].is_null());
    }
}
