//! The streamed form of a Response: OpenAI's `response.*` server-sent events, in its order, each with
//! the next `sequence_number`: `response.created`, `response.in_progress`, then per output item
//! `output_item.added`, its content as it comes (a message's `content_part.added`, `output_text.delta`…,
//! `output_text.done`, `content_part.done`; a call's `function_call_arguments.delta`…/`.done`;
//! reasoning's `reasoning_text.delta`…/`.done`), `output_item.done`, and last `response.completed` or
//! `response.incomplete` (`response.failed` when the engine call failed midway).
//!
//! The writer is fed the deltas of the engine's streamed chat chunks (`chat_chunk`); an item is open
//! until output of another kind starts (reasoning, then text, then calls) or the answer ends.
//!
//! In an MCP tool loop one Response spans several engine calls (turns, each ended by `end_turn`) and the
//! gateway's own items: `mcp_list_tools` (`response.mcp_list_tools.in_progress`, then `.completed` or
//! `.failed`), `mcp_call` (`response.mcp_call.in_progress`, `response.mcp_call_arguments.delta`/`.done`,
//! then `response.mcp_call.completed` or `.failed`) and `mcp_approval_request`, each between its
//! `output_item.added` and `.done`. A call the model makes to an MCP tool is held back (`take_held`), not
//! streamed as a `function_call`: the loop streams it as the `mcp_call` it becomes.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::items::new_id;

enum Open {
    Nothing,
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// A call to an MCP tool: nothing streamed yet.
    Held(HeldCall),
}

/// A call the model made to an MCP tool, held back from the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldCall {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

/// What one chat chunk said beyond its deltas.
#[derive(Debug, Default, PartialEq)]
pub struct ChunkEnd {
    pub finish_reason: Option<String>,
    pub usage: Option<Value>,
}

pub struct EventWriter {
    out: Vec<u8>,
    sequence: u64,
    items: Vec<Value>,
    open: Open,
    /// Tools whose calls are held back (the MCP servers' tools).
    held_names: HashSet<String>,
    held: Vec<HeldCall>,
    /// Where the current turn's items start.
    turn_start: usize,
}

impl EventWriter {
    /// Opens the stream with `response.created` and `response.in_progress` of `opening` (the Response
    /// in progress, no output yet).
    pub fn start(opening: &Value) -> EventWriter {
        let mut w = EventWriter {
            out: Vec::new(),
            sequence: 0,
            items: Vec::new(),
            open: Open::Nothing,
            held_names: HashSet::new(),
            held: Vec::new(),
            turn_start: 0,
        };
        w.event("response.created", json!({"response": opening}));
        w.event("response.in_progress", json!({"response": opening}));
        w
    }

    /// The events written since the last take.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    fn event(&mut self, kind: &str, mut fields: Value) {
        fields["type"] = kind.into();
        fields["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        self.out.extend_from_slice(format!("event: {kind}\ndata: ").as_bytes());
        self.out
            .extend_from_slice(&serde_json::to_vec(&fields).unwrap_or_default());
        self.out.extend_from_slice(b"\n\n");
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// One streamed chat chunk (`{"choices": [{"delta", "finish_reason"}], "usage"?}`).
    pub fn chat_chunk(&mut self, chunk: &Value) -> ChunkEnd {
        let mut end = ChunkEnd {
            usage: chunk.get("usage").filter(|u| !u.is_null()).cloned(),
            ..ChunkEnd::default()
        };
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
            return end;
        };
        let delta = &choice["delta"];
        if let Some(reasoning) = delta["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            self.reasoning(reasoning);
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text(text);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            if let Some(call_id) = call["id"].as_str() {
                let name = call["function"]["name"].as_str().unwrap_or_default();
                if self.held_names.contains(name) {
                    self.close("completed");
                    self.open = Open::Held(HeldCall {
                        call_id: call_id.to_string(),
                        name: name.to_string(),
                        arguments: String::new(),
                    });
                } else {
                    self.call(call_id, name);
                }
            }
            if let Some(arguments) = call["function"]["arguments"].as_str().filter(|a| !a.is_empty()) {
                self.arguments(arguments);
            }
        }
        end.finish_reason = choice["finish_reason"].as_str().map(str::to_string);
        end
    }

    pub fn reasoning(&mut self, delta: &str) {
        if !matches!(self.open, Open::Reasoning { .. }) {
            self.close("completed");
            let id = new_id("rs");
            let item = json!({"id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"});
            self.event(
                "response.output_item.added",
                json!({"output_index": self.index(), "item": item}),
            );
            self.open = Open::Reasoning {
                id,
                text: String::new(),
            };
        }
        let index = self.index();
        if let Open::Reasoning { id, text } = &mut self.open {
            text.push_str(delta);
            let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
            self.event("response.reasoning_text.delta", fields);
        }
    }

    pub fn text(&mut self, delta: &str) {
        if !matches!(self.open, Open::Message { .. }) {
            self.close("completed");
            let id = new_id("msg");
            let item =
                json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
            let index = self.index();
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            let fields = json!({"item_id": id, "output_index": index, "content_index": 0, "part": part});
            self.event("response.content_part.added", fields);
            self.open = Open::Message {
                id,
                text: String::new(),
            };
        }
        if delta.is_empty() {
            return;
        }
        let index = self.index();
        if let Open::Message { id, text } = &mut self.open {
            text.push_str(delta);
            let fields =
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []});
            self.event("response.output_text.delta", fields);
        }
    }

    pub fn call(&mut self, call_id: &str, name: &str) {
        self.close("completed");
        let id = new_id("fc");
        let item = json!({
            "id": id, "type": "function_call", "status": "in_progress",
            "call_id": call_id, "name": name, "arguments": "",
        });
        self.event(
            "response.output_item.added",
            json!({"output_index": self.index(), "item": item}),
        );
        self.open = Open::Call {
            id,
            call_id: call_id.to_string(),
            name: name.to_string(),
            arguments: String::new(),
        };
    }

    pub fn arguments(&mut self, delta: &str) {
        if let Open::Held(held) = &mut self.open {
            held.arguments.push_str(delta);
            return;
        }
        let index = self.index();
        if let Open::Call { id, arguments, .. } = &mut self.open {
            arguments.push_str(delta);
            let fields = json!({"item_id": id, "output_index": index, "delta": delta});
            self.event("response.function_call_arguments.delta", fields);
        }
    }

    /// Ends the open item (`status`: completed, or incomplete when the token limit cut it).
    fn close(&mut self, status: &str) {
        let index = self.index();
        let item = match std::mem::replace(&mut self.open, Open::Nothing) {
            Open::Nothing => return,
            Open::Held(held) => {
                self.held.push(held);
                return;
            }
            Open::Reasoning { id, text } => {
                let at = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
                self.event("response.reasoning_text.done", at);
                json!({
                    "id": id, "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": text}], "status": status,
                })
            }
            Open::Message { id, text } => {
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = at.clone();
                done["text"] = text.as_str().into();
                done["logprobs"] = json!([]);
                self.event("response.output_text.done", done);
                let mut part_done = at;
                part_done["part"] = part.clone();
                self.event("response.content_part.done", part_done);
                json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": [part]})
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                let fields = json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments});
                self.event("response.function_call_arguments.done", fields);
                json!({
                    "id": id, "type": "function_call", "status": "completed",
                    "call_id": call_id, "name": name, "arguments": arguments,
                })
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.items.push(item);
    }

    /// Ends the open item; the output items, in order.
    pub fn close_items(&mut self, cut: bool) -> Vec<Value> {
        self.end_turn(cut);
        self.items.clone()
    }

    /// Holds back calls to these tools (`take_held`) instead of streaming them as function calls.
    pub fn hold_calls_to(&mut self, names: HashSet<String>) {
        self.held_names = names;
    }

    /// Ends an engine call's output: closes its open item; the items it made.
    pub fn end_turn(&mut self, cut: bool) -> Vec<Value> {
        let nothing = self.items.len() == self.turn_start && self.held.is_empty();
        if nothing && matches!(self.open, Open::Nothing) {
            // An empty answer is still one (empty) message, as non-streamed.
            self.text("");
        }
        self.close(if cut { "incomplete" } else { "completed" });
        let turn = self.items[self.turn_start..].to_vec();
        self.turn_start = self.items.len();
        turn
    }

    /// The calls to MCP tools held back since the last take.
    pub fn take_held(&mut self) -> Vec<HeldCall> {
        std::mem::take(&mut self.held)
    }

    /// `output_item.added` for an item the gateway makes (the next output index).
    fn gateway_item_added(&mut self, item: &Value) {
        self.close("completed");
        let index = self.index();
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
    }

    /// An event about the item being added (`item_id`, `output_index` and `extra`'s fields).
    fn item_event(&mut self, kind: &str, item: &Value, extra: Value) {
        let mut fields = json!({"item_id": item["id"], "output_index": self.index()});
        if let (Value::Object(fields), Value::Object(extra)) = (&mut fields, extra) {
            fields.extend(extra);
        }
        self.event(kind, fields);
    }

    /// `output_item.done` for the item being added, which takes its output index.
    fn gateway_item_done(&mut self, item: Value) {
        let index = self.index();
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.items.push(item);
        self.turn_start = self.items.len();
    }

    /// An `mcp_list_tools` item starts (`item`: its id and label, no tools yet).
    pub fn mcp_list_started(&mut self, item: &Value) {
        self.gateway_item_added(item);
        self.item_event("response.mcp_list_tools.in_progress", item, json!({}));
    }

    /// The listing ended: `.completed`, or `.failed` when `item` has an error.
    pub fn mcp_list_done(&mut self, item: Value) {
        let failed = item.get("error").is_some_and(|e| !e.is_null());
        let kind = if failed {
            "response.mcp_list_tools.failed"
        } else {
            "response.mcp_list_tools.completed"
        };
        self.item_event(kind, &item, json!({}));
        self.gateway_item_done(item);
    }

    /// An `mcp_call` starts (`item` in progress): its arguments stream in one delta.
    pub fn mcp_call_started(&mut self, item: &Value) {
        let mut added = item.clone();
        added["arguments"] = "".into();
        self.gateway_item_added(&added);
        self.item_event("response.mcp_call.in_progress", item, json!({}));
        let arguments = item["arguments"].clone();
        self.item_event("response.mcp_call_arguments.delta", item, json!({"delta": arguments}));
        self.item_event(
            "response.mcp_call_arguments.done",
            item,
            json!({"arguments": arguments}),
        );
    }

    /// The call ended: `.completed`, or `.failed` when `item` has an error.
    pub fn mcp_call_done(&mut self, item: Value) {
        let failed = item.get("error").is_some_and(|e| !e.is_null());
        let kind = if failed {
            "response.mcp_call.failed"
        } else {
            "response.mcp_call.completed"
        };
        self.item_event(kind, &item, json!({}));
        self.gateway_item_done(item);
    }

    /// An item that is whole at once (`mcp_approval_request`): added, then done.
    pub fn whole_item(&mut self, item: Value) {
        self.gateway_item_added(&item);
        self.gateway_item_done(item);
    }

    /// The last event: `response.completed`, `.incomplete` or `.failed` by the Response's status.
    pub fn finish(&mut self, response: &Value) {
        let kind = match response["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            Some("failed") => "response.failed",
            _ => "response.completed",
        };
        self.event(kind, json!({"response": response}));
    }
}

/// The JSON chunks of chat SSE bytes (`data: {...}` events; `[DONE]` and anything else skipped).
pub fn chat_chunks(sse: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(sse)
        .split("\n\n")
        .filter_map(|event| event.trim().strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{chat_chunks, EventWriter};

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

    fn chunk(delta: Value, finish: Value) -> Value {
        json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    #[test]
    fn events_come_in_openais_order_with_increasing_sequence_numbers() {
        let mut w = EventWriter::start(&json!({"status": "in_progress", "output": []}));
        let chunks = [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"reasoning_content": "h"}), Value::Null),
            chunk(json!({"reasoning_content": "m"}), Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null),
            chunk(json!({"content": "!"}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "f", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
                json!("tool_calls"),
            ),
        ];
        let mut finish = None;
        for c in &chunks {
            finish = w.chat_chunk(c).finish_reason.or(finish);
        }
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        let items = w.close_items(false);
        w.finish(&json!({"status": "completed", "output": items}));
        let events = parse(&w.take());
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
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
        assert_eq!(events[11]["text"], "Hi!");
        assert_eq!(events[16]["arguments"], "{}");
        assert_eq!(
            [events[6]["output_index"].as_u64(), events[17]["output_index"].as_u64()],
            [Some(0), Some(2)]
        );
        let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(items[2]["call_id"], "call_1");
    }

    #[test]
    fn a_cut_answer_ends_incomplete() {
        let mut w = EventWriter::start(&json!({}));
        w.chat_chunk(&chunk(json!({"content": "abc"}), json!("length")));
        let items = w.close_items(true);
        assert_eq!(items[0]["status"], "incomplete");
        w.finish(&json!({"status": "incomplete"}));
        let events = parse(&w.take());
        assert_eq!(events.last().unwrap()["type"], "response.incomplete");
    }

    #[test]
    fn mcp_items_and_held_calls_stream_in_order_across_turns() {
        let mut w = EventWriter::start(&json!({}));
        let listing =
            json!({"id": "mcpl_1", "type": "mcp_list_tools", "server_label": "calc", "tools": [], "error": null});
        w.mcp_list_started(&listing);
        let mut listed = listing.clone();
        listed["tools"] = json!([{"name": "add"}]);
        w.mcp_list_done(listed);
        w.hold_calls_to(["add".to_string()].into_iter().collect());
        // Turn 1: the model calls the MCP tool: nothing streamed for it, the call held back.
        w.chat_chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": ""}}]}),
            Value::Null,
        ));
        w.chat_chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":1}"}}]}),
            json!("tool_calls"),
        ));
        assert_eq!(
            w.end_turn(false),
            Vec::<Value>::new(),
            "no item, not even an empty message"
        );
        let held = w.take_held();
        assert_eq!(
            (held[0].name.as_str(), held[0].arguments.as_str()),
            ("add", "{\"a\":1}")
        );
        let call = json!({"id": "mcp_1", "type": "mcp_call", "server_label": "calc", "name": "add",
            "arguments": "{\"a\":1}", "output": null, "error": null});
        w.mcp_call_started(&call);
        let mut ended = call.clone();
        ended["error"] = "down".into();
        w.mcp_call_done(ended);
        // Turn 2: the final answer.
        w.chat_chunk(&chunk(json!({"content": "1"}), json!("stop")));
        let items = w.close_items(false);
        w.finish(&json!({"status": "completed", "output": items}));
        let events = parse(&w.take());
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.mcp_list_tools.in_progress",
                "response.mcp_list_tools.completed",
                "response.output_item.done",
                "response.output_item.added",
                "response.mcp_call.in_progress",
                "response.mcp_call_arguments.delta",
                "response.mcp_call_arguments.done",
                "response.mcp_call.failed",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
        let index = |i: usize| events[i]["output_index"].as_u64();
        assert_eq!(
            [index(2), index(5), index(6), index(11), index(12), index(17)],
            [Some(0), Some(0), Some(1), Some(1), Some(2), Some(2)]
        );
        assert_eq!(events[6]["item"]["arguments"], "", "arguments come as deltas");
        assert_eq!(events[9]["arguments"], "{\"a\":1}");
        assert_eq!(events[5]["item"]["tools"][0]["name"], "add");
        let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["mcp_list_tools", "mcp_call", "message"]);
    }

    #[test]
    fn chat_sse_is_read_back_as_chunks() {
        let sse = b"data: {\"choices\": []}\n\ndata: {\"usage\": {\"prompt_tokens\": 3}}\n\ndata: [DONE]\n\n";
        assert_eq!(chat_chunks(sse).len(), 2);
    }
}
