//! The streamed form of a Response: OpenAI's `response.*` server-sent events, in its order, each with
//! the next `sequence_number`: `response.created`, `response.in_progress`, then per output item
//! `output_item.added`, its content (a message's `content_part.added`, `output_text.delta`,
//! `output_text.done`, `content_part.done`; a call's `function_call_arguments.delta`/`.done`; reasoning's
//! `reasoning_text.delta`/`.done`), `output_item.done`, and last `response.completed` or
//! `response.incomplete`.
//!
//! The events are written from the finished Response (the engine call is made whole, see docs/responses.md):
//! each text arrives as one delta.

use serde_json::{json, Value};

/// Writes events with increasing sequence numbers.
struct Writer {
    out: Vec<u8>,
    sequence: u64,
}

impl Writer {
    fn event(&mut self, kind: &str, mut fields: Value) {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        self.out.extend_from_slice(format!("event: {kind}\ndata: ").as_bytes());
        self.out
            .extend_from_slice(&serde_json::to_vec(&fields).unwrap_or_default());
        self.out.extend_from_slice(b"\n\n");
    }
}

/// Every event of `response` (the finished Response object).
pub fn stream_events(response: &Value) -> Vec<u8> {
    let mut w = Writer {
        out: Vec::new(),
        sequence: 0,
    };
    let mut opening = response.clone();
    opening["status"] = "in_progress".into();
    opening["output"] = json!([]);
    opening["usage"] = Value::Null;
    opening["incomplete_details"] = Value::Null;
    w.event("response.created", json!({"response": opening}));
    w.event("response.in_progress", json!({"response": opening}));
    let output = response["output"].as_array().cloned().unwrap_or_default();
    for (index, item) in output.iter().enumerate() {
        item_events(&mut w, index, item);
    }
    let last = if response["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    w.event(last, json!({"response": response}));
    w.out
}

fn item_events(w: &mut Writer, index: usize, item: &Value) {
    let id = item["id"].clone();
    let mut added = item.clone();
    added["status"] = "in_progress".into();
    match item["type"].as_str() {
        Some("message") => {
            added["content"] = json!([]);
            w.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let parts = item["content"].as_array().cloned().unwrap_or_default();
            for (part_index, part) in parts.iter().enumerate() {
                let text = part["text"].as_str().unwrap_or_default();
                let at = json!({"item_id": id, "output_index": index, "content_index": part_index});
                let with = |extra: Value| {
                    let mut v = at.clone();
                    for (k, x) in extra.as_object().into_iter().flatten() {
                        v[k] = x.clone();
                    }
                    v
                };
                let empty = json!({"type": "output_text", "text": "", "annotations": []});
                w.event("response.content_part.added", with(json!({"part": empty})));
                if !text.is_empty() {
                    w.event(
                        "response.output_text.delta",
                        with(json!({"delta": text, "logprobs": []})),
                    );
                }
                w.event("response.output_text.done", with(json!({"text": text, "logprobs": []})));
                w.event("response.content_part.done", with(json!({"part": part})));
            }
        }
        Some("function_call") => {
            added["arguments"] = "".into();
            w.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let arguments = item["arguments"].clone();
            w.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": arguments}),
            );
            w.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": item["name"], "arguments": arguments}),
            );
        }
        Some("reasoning") => {
            added["content"] = json!([]);
            w.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let parts = item["content"].as_array().cloned().unwrap_or_default();
            for (part_index, part) in parts.iter().enumerate() {
                let at = |k: &str, v: &Value| json!({"item_id": id, "output_index": index, "content_index": part_index, k: v});
                w.event("response.reasoning_text.delta", at("delta", &part["text"]));
                w.event("response.reasoning_text.done", at("text", &part["text"]));
            }
        }
        _ => w.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ),
    }
    w.event(
        "response.output_item.done",
        json!({"output_index": index, "item": item}),
    );
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::stream_events;

    fn parse(bytes: &[u8]) -> Vec<Value> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (event, data) = e.split_once('\n').unwrap();
                let value: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(event.strip_prefix("event: ").unwrap(), value["type"]);
                value
            })
            .collect()
    }

    #[test]
    fn events_come_in_openais_order_with_increasing_sequence_numbers() {
        let response = json!({
            "id": "resp_1", "status": "completed", "usage": {"total_tokens": 3},
            "output": [
                {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
                {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Hi", "annotations": []}]},
                {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            ],
        });
        let events = parse(&stream_events(&response));
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert_eq!(events[0]["response"]["output"], json!([]));
        assert_eq!(events[8]["delta"], "Hi");
        assert_eq!(events[16]["response"]["status"], "completed");
        let cut = json!({"status": "incomplete", "output": []});
        let events = parse(&stream_events(&cut));
        assert_eq!(events.last().unwrap()["type"], "response.incomplete");
    }
}
