//! Output items and the Response object, in OpenAI's shapes: the chat choice the engine call produced
//! becomes a `reasoning` item (`rs_…`), a `message` item (`msg_…`) and one `function_call` item (`fc_…`)
//! per call; ids are the gateway's own (`resp_…`, `conv_…` too).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use super::request::ResponsesRequest;
use crate::openai::response::Usage;

/// `<prefix>_` and 32 hex digits, random (std seeds each `RandomState` from the OS) and never repeated.
pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let a = RandomState::new().hash_one(n);
    let b = RandomState::new().hash_one(a);
    format!("{prefix}_{a:016x}{b:016x}")
}

/// The output items of one chat choice (`{"message": {...}, "finish_reason"}`), and whether the answer
/// was cut by the token limit.
pub fn output_items(choice: &Value) -> (Vec<Value>, bool) {
    let message = &choice["message"];
    let cut = choice["finish_reason"] == "length";
    let status = if cut { "incomplete" } else { "completed" };
    let mut items = Vec::new();
    if let Some(reasoning) = message
        .get("reasoning_content")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        items.push(json!({
            "id": new_id("rs"),
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": reasoning}],
            "status": status,
        }));
    }
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let text = message.get("content").and_then(Value::as_str).unwrap_or_default();
    if !text.is_empty() || calls.is_empty() {
        items.push(json!({
            "id": new_id("msg"),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }));
    }
    for call in calls {
        items.push(json!({
            "id": new_id("fc"),
            "type": "function_call",
            "status": "completed",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }));
    }
    (items, cut)
}

/// OpenAI's usage object.
pub fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// What a Response object says beyond the request's echo.
pub struct Outcome<'a> {
    pub id: &'a str,
    pub created_at: i64,
    pub model: &'a str,
    /// "in_progress", "completed" or "incomplete".
    pub status: &'a str,
    pub output: Vec<Value>,
    pub usage: Option<Value>,
}

/// The Response object for `req`.
pub fn response_object(req: &ResponsesRequest, o: Outcome<'_>) -> Value {
    let body_or = |name: &str, default: Value| match req.body.get(name) {
        Some(v) if !v.is_null() => v.clone(),
        _ => default,
    };
    let incomplete = (o.status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
    let mut text = body_or("text", json!({"format": {"type": "text"}}));
    if text.get("format").is_none_or(Value::is_null) {
        text["format"] = json!({"type": "text"});
    }
    let tools = body_or("tools", json!([]));
    let default_choice = if tools.as_array().is_some_and(|t| !t.is_empty()) {
        "auto"
    } else {
        "none"
    };
    let mut response = json!({
        "id": o.id,
        "object": "response",
        "created_at": o.created_at,
        "status": o.status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.field("max_output_tokens"),
        "model": o.model,
        "output": o.output,
        "parallel_tool_calls": body_or("parallel_tool_calls", json!(true)),
        "previous_response_id": req.previous_response_id,
        "reasoning": body_or("reasoning", json!({"effort": null, "summary": null})),
        "store": req.store,
        "temperature": body_or("temperature", json!(1.0)),
        "text": text,
        "tool_choice": body_or("tool_choice", json!(default_choice)),
        "tools": tools,
        "top_p": body_or("top_p", json!(1.0)),
        "truncation": "disabled",
        "usage": o.usage,
        "user": req.field("user"),
        "metadata": req.metadata,
    });
    if let Some(conversation) = &req.conversation {
        response["conversation"] = json!({"id": conversation});
    }
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{new_id, output_items};

    #[test]
    fn a_choice_becomes_reasoning_message_and_call_items() {
        let choice = json!({
            "message": {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning_content": "Weather needed.",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
            },
            "finish_reason": "tool_calls",
        });
        let (items, cut) = output_items(&choice);
        assert!(!cut);
        let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert!(items[0]["id"].as_str().unwrap().starts_with("rs_"));
        assert!(items[1]["id"].as_str().unwrap().starts_with("msg_"));
        assert!(items[2]["id"].as_str().unwrap().starts_with("fc_"));
        assert_eq!(items[2]["call_id"], "call_1");
        let cut_choice = json!({"message": {"content": "abc"}, "finish_reason": "length"});
        let (items, cut) = output_items(&cut_choice);
        assert!(cut);
        assert_eq!(items[0]["status"], "incomplete");
    }

    #[test]
    fn ids_differ() {
        assert_ne!(new_id("resp"), new_id("resp"));
        assert_eq!(new_id("resp").len(), "resp_".len() + 32);
    }
}
