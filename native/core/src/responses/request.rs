//! A `POST /v1/responses` body: parsed and checked, and turned into the chat request the rest of the
//! gateway already serves (template, tools, structured outputs, reasoning), so the Responses API adds
//! no second path to the engines.
//!
//! Items become chat messages: `message` items (`input_text`/`output_text` parts joined, an assistant's
//! `refusal` parts as its text) keep their role (`developer` reads as `system`), `function_call` items
//! become the assistant's `tool_calls`, `function_call_output` items `tool` messages; `reasoning` items are
//! not replayed (chat templates drop past reasoning too). Image, file and audio parts are refused with a
//! 400 naming the part: the engines behind the gateway take text only, and a part dropped silently would
//! change the question unseen.

use serde_json::{json, Map, Value};

use super::items::new_id;
use crate::error::ApiError;
use crate::openai::request::{parse_chat_request, GenerationRequest};

/// Sampling fields passed to the chat request unchanged.
const SAMPLING_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "parallel_tool_calls",
    "user",
];

/// Fields that would change the answer and are not offered: refused, never ignored.
const REFUSED_FIELDS: &[&str] = &["background", "prompt", "top_logprobs"];

/// The request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    pub model: String,
    /// The request's own input items, each with an `id` (string input: one user message).
    pub input: Vec<Value>,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub conversation: Option<String>,
    pub store: bool,
    pub stream: bool,
    pub metadata: Value,
    /// The body as sent: the fields the Response object echoes (tools, text, reasoning...) come from it.
    pub body: Map<String, Value>,
}

impl ResponsesRequest {
    /// A body field, or null.
    pub fn field(&self, name: &str) -> Value {
        self.body.get(name).cloned().unwrap_or(Value::Null)
    }
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message).with_code("invalid_value")
}

fn opt_string(body: &Map<String, Value>, name: &str) -> Result<Option<String>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::invalid_param(name, format!("'{name}' must be a string")).with_code("invalid_type")),
    }
}

/// Parses and checks the body (the parts the chat request does not check itself).
pub fn parse(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}")))?;
    let Value::Object(body) = value else {
        return Err(ApiError::invalid("request body must be a JSON object"));
    };
    let model = opt_string(&body, "model")?.ok_or_else(|| {
        ApiError::invalid_param("model", "'model' is required").with_code("missing_required_parameter")
    })?;
    for name in REFUSED_FIELDS {
        let asks = match body.get(*name) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            _ => true,
        };
        if asks {
            return Err(
                ApiError::invalid_param(name, format!("'{name}' is not supported by this gateway"))
                    .with_code("unsupported_parameter"),
            );
        }
    }
    let input = match body.get("input") {
        Some(Value::String(text)) => vec![user_message(text)],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                out.push(input_item(item, &format!("input[{i}]"))?);
            }
            out
        }
        None | Some(Value::Null) => {
            return Err(invalid("input", "'input' is required").with_code("missing_required_parameter"))
        }
        Some(_) => return Err(invalid("input", "'input' must be a string or a list of items")),
    };
    let instructions = opt_string(&body, "instructions")?;
    let previous_response_id = opt_string(&body, "previous_response_id")?;
    let conversation = match body.get("conversation") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Object(c)) => match c.get("id") {
            Some(Value::String(id)) => Some(id.clone()),
            _ => return Err(invalid("conversation.id", "'conversation.id' must be a string")),
        },
        Some(_) => return Err(invalid("conversation", "'conversation' must be an id or {\"id\": ...}")),
    };
    if conversation.is_some() && previous_response_id.is_some() {
        return Err(ApiError::invalid_param(
            "conversation",
            "'conversation' and 'previous_response_id' cannot be used together",
        )
        .with_code("conflicting_parameters"));
    }
    let flag = |name: &str, default: bool| match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid_param(name, format!("'{name}' must be a boolean")).with_code("invalid_type")),
    };
    let store = flag("store", true)?;
    let stream = flag("stream", false)?;
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(m)) => {
            check_metadata(m, "metadata")?;
            Value::Object(m.clone())
        }
        Some(_) => return Err(invalid("metadata", "'metadata' must be an object of strings")),
    };
    Ok(ResponsesRequest {
        model,
        input,
        instructions,
        previous_response_id,
        conversation,
        store,
        stream,
        metadata,
        body,
    })
}

/// OpenAI's limits on metadata: up to 16 keys of at most 64 characters, string values of at most 512.
pub fn check_metadata(m: &Map<String, Value>, param: &str) -> Result<(), ApiError> {
    if m.len() > 16 {
        return Err(invalid(param, "metadata holds at most 16 keys"));
    }
    for (key, value) in m {
        match value {
            Value::String(v) if key.chars().count() <= 64 && v.chars().count() <= 512 => {}
            _ => {
                return Err(invalid(
                    &format!("{param}.{key}"),
                    "metadata keys are at most 64 characters, values strings of at most 512",
                ))
            }
        }
    }
    Ok(())
}

/// A user message item holding `text`.
pub fn user_message(text: &str) -> Value {
    json!({
        "id": new_id("msg"),
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    })
}

/// One input item, checked and given an `id` when it has none (stored items need one).
pub fn input_item(item: &Value, param: &str) -> Result<Value, ApiError> {
    let Value::Object(obj) = item else {
        return Err(invalid(param, "an input item must be an object"));
    };
    let mut obj = obj.clone();
    let kind = match obj.get("type") {
        Some(Value::String(t)) => t.clone(),
        // An "easy input message" ({role, content}) has no type.
        None if obj.contains_key("role") => "message".to_string(),
        _ => return Err(invalid(&format!("{param}.type"), "an input item needs a 'type'")),
    };
    let prefix = match kind.as_str() {
        "message" => {
            let role = obj.get("role").and_then(Value::as_str).unwrap_or_default();
            if !matches!(role, "user" | "system" | "developer" | "assistant") {
                return Err(invalid(
                    &format!("{param}.role"),
                    "role must be one of user, system, developer, assistant",
                ));
            }
            let content = match obj.get("content") {
                Some(Value::String(text)) => {
                    let part = if role == "assistant" {
                        "output_text"
                    } else {
                        "input_text"
                    };
                    json!([{"type": part, "text": text}])
                }
                Some(Value::Array(parts)) => {
                    for (j, part) in parts.iter().enumerate() {
                        check_part(part, role, &format!("{param}.content[{j}]"))?;
                    }
                    Value::Array(parts.clone())
                }
                _ => {
                    return Err(invalid(
                        &format!("{param}.content"),
                        "content must be a string or a list of parts",
                    ))
                }
            };
            obj.insert("content".into(), content);
            obj.insert("type".into(), "message".into());
            "msg"
        }
        "function_call" => {
            for field in ["call_id", "name", "arguments"] {
                if !obj.get(field).is_some_and(Value::is_string) {
                    return Err(invalid(
                        &format!("{param}.{field}"),
                        format!("'{field}' must be a string"),
                    ));
                }
            }
            "fc"
        }
        "function_call_output" => {
            if !obj.get("call_id").is_some_and(Value::is_string) {
                return Err(invalid(&format!("{param}.call_id"), "'call_id' must be a string"));
            }
            if !obj.get("output").is_some_and(Value::is_string) {
                return Err(invalid(&format!("{param}.output"), "'output' must be a string"));
            }
            "fco"
        }
        "reasoning" => "rs",
        "mcp_approval_response" => {
            if !obj.get("approval_request_id").is_some_and(Value::is_string) {
                return Err(invalid(
                    &format!("{param}.approval_request_id"),
                    "'approval_request_id' must be a string",
                ));
            }
            if !obj.get("approve").is_some_and(Value::is_boolean) {
                return Err(invalid(&format!("{param}.approve"), "'approve' must be a boolean"));
            }
            "mcpa"
        }
        // Earlier output replayed as input.
        "mcp_list_tools" => "mcpl",
        "mcp_call" | "mcp_approval_request" => {
            for field in ["server_label", "name", "arguments"] {
                if !obj.get(field).is_some_and(Value::is_string) {
                    return Err(invalid(
                        &format!("{param}.{field}"),
                        format!("'{field}' must be a string"),
                    ));
                }
            }
            if kind == "mcp_call" {
                "mcp"
            } else {
                "mcpr"
            }
        }
        other => {
            return Err(ApiError::invalid_param(
                &format!("{param}.type"),
                format!("input items of type '{other}' are not supported"),
            )
            .with_code("unsupported_value"))
        }
    };
    if !obj.get("id").is_some_and(Value::is_string) {
        obj.insert("id".into(), new_id(prefix).into());
    }
    Ok(Value::Object(obj))
}

/// Checks one content part of a message whose role is `role`: text parts (`input_text`, `output_text`,
/// `text`) with a `text` string, or an assistant's `refusal` (replayed history) with a `refusal` string.
fn check_part(part: &Value, role: &str, param: &str) -> Result<(), ApiError> {
    let Value::Object(part) = part else {
        return Err(invalid(param, "a content part must be an object"));
    };
    let kind_param = format!("{param}.type");
    let field = match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => "text",
        Some("refusal") if role == "assistant" => "refusal",
        Some("refusal") => {
            return Err(invalid(&kind_param, "'refusal' parts belong to assistant messages"));
        }
        Some(kind @ ("input_image" | "input_file" | "input_audio")) => {
            return Err(ApiError::invalid_param(
                &kind_param,
                format!("'{kind}' content parts are not supported: the models of this gateway take text only"),
            )
            .with_code("unsupported_value"));
        }
        Some(other) => {
            return Err(ApiError::invalid_param(
                &kind_param,
                format!("content parts of type '{other}' are not supported"),
            )
            .with_code("unsupported_value"));
        }
        None => return Err(invalid(&kind_param, "a content part needs a 'type'")),
    };
    if !part.get(field).is_some_and(Value::is_string) {
        return Err(invalid(
            &format!("{param}.{field}"),
            format!("'{field}' must be a string"),
        ));
    }
    Ok(())
}

/// The text of a message item's content parts (a refusal's as text), joined.
fn item_text(item: &Value) -> String {
    match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").or_else(|| p.get("refusal")).and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Chat messages for `instructions` and the items, in order (history first, then the request's own).
pub fn messages(instructions: Option<&str>, items: &[Value]) -> Vec<Value> {
    let mut messages: Vec<Value> = Vec::new();
    if let Some(instructions) = instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    // Results of MCP calls wait until the calls of their turn are all in the assistant's message.
    let mut results: Vec<Value> = Vec::new();
    for item in items {
        let kind = item.get("type").and_then(Value::as_str);
        if !matches!(kind, Some("mcp_call" | "mcp_approval_request")) {
            messages.append(&mut results);
        }
        match kind {
            Some("message") => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer") => "system",
                    Some(role) => role,
                    None => "user",
                };
                messages.push(json!({"role": role, "content": item_text(item)}));
            }
            Some("function_call") => add_call(&mut messages, &item["call_id"], &item["name"], &item["arguments"]),
            Some("function_call_output") => messages.push(json!({
                "role": "tool",
                "tool_call_id": item["call_id"],
                "content": item["output"],
            })),
            // An approval request is the model's call; its result comes with the approval's `mcp_call`
            // (or the denial).
            Some("mcp_approval_request") => add_call(&mut messages, &item["id"], &item["name"], &item["arguments"]),
            Some("mcp_call") => {
                let approved = item.get("approval_request_id").filter(|a| a.is_string());
                let id = match approved {
                    Some(request_id) => request_id,
                    None => {
                        add_call(&mut messages, &item["id"], &item["name"], &item["arguments"]);
                        &item["id"]
                    }
                };
                let content = match (item.get("output").and_then(Value::as_str), item.get("error")) {
                    (_, Some(Value::String(error))) => format!("Error: {error}"),
                    (Some(output), _) => output.to_string(),
                    (None, _) => String::new(),
                };
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            Some("mcp_approval_response") if item["approve"] == false => messages.push(json!({
                "role": "tool",
                "tool_call_id": item["approval_request_id"],
                "content": DENIED,
            })),
            _ => {}
        }
    }
    messages.append(&mut results);
    messages
}

/// What the model reads for a call the client did not approve.
pub const DENIED: &str = "The user denied this tool call.";

/// Adds a tool call to the assistant's message: calls of one turn are one message, with the text that came
/// before them.
fn add_call(messages: &mut Vec<Value>, id: &Value, name: &Value, arguments: &Value) {
    let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
    match messages.last_mut().filter(|m| m["role"] == "assistant") {
        Some(last) => match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
            Some(calls) => calls.push(call),
            None => last["tool_calls"] = json!([call]),
        },
        None => messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
    }
}

/// The chat request for `req` over `history` (the stored items before the request's own).
pub fn chat_request(req: &ResponsesRequest, history: &[Value]) -> Result<GenerationRequest, ApiError> {
    let mut items: Vec<Value> = history.to_vec();
    items.extend(req.input.iter().cloned());
    chat_request_over(req, &items, &[])
}

/// The chat request for `req` over all of `items` (history, the request's input, output so far), with
/// `extra_tools` (chat function tools: the MCP servers' tools) after the request's function tools.
pub fn chat_request_over(
    req: &ResponsesRequest,
    items: &[Value],
    extra_tools: &[Value],
) -> Result<GenerationRequest, ApiError> {
    let mut chat = Map::new();
    chat.insert("model".into(), req.model.clone().into());
    chat.insert("messages".into(), messages(req.instructions.as_deref(), items).into());
    for name in SAMPLING_FIELDS {
        if let Some(v) = req.body.get(*name).filter(|v| !v.is_null()) {
            chat.insert(name.to_string(), v.clone());
        }
    }
    if let Some(v) = req.body.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_completion_tokens".into(), v.clone());
    }
    let mut tools = match req.body.get("tools").filter(|v| !v.is_null()) {
        Some(tools) => chat_tools(tools)?,
        None => Vec::new(),
    };
    tools.extend(extra_tools.iter().cloned());
    if !tools.is_empty() {
        chat.insert("tools".into(), tools.into());
    }
    if let Some(choice) = req.body.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(format) = req
        .body
        .get("text")
        .filter(|v| !v.is_null())
        .and_then(|t| t.get("format"))
    {
        if let Some(format) = response_format(format)? {
            chat.insert("response_format".into(), format);
        }
    }
    if let Some(effort) = req
        .body
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|v| !v.is_null())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    let body = serde_json::to_vec(&Value::Object(chat)).map_err(|e| ApiError::internal(e.to_string()))?;
    parse_chat_request(&body).map_err(rename_param)
}

/// The chat parser names chat fields: the client sent the Responses API's.
fn rename_param(mut error: ApiError) -> ApiError {
    if let Some(param) = error.param.take() {
        let renamed = [
            ("max_completion_tokens", "max_output_tokens"),
            ("max_tokens", "max_output_tokens"),
            ("response_format.json_schema.", "text.format."),
            ("response_format", "text.format"),
            ("reasoning_effort", "reasoning.effort"),
            ("messages", "input"),
        ]
        .iter()
        .find_map(|(from, to)| param.strip_prefix(from).map(|rest| format!("{to}{rest}")));
        let renamed = match renamed {
            Some(r) => r,
            // Chat tools nest their fields under `function`; Responses tools do not.
            None if param.starts_with("tools[") => param.replace(".function.", "."),
            None => param,
        };
        error.param = Some(renamed);
    }
    error
}

/// Responses function tools (`{"type": "function", "name", "description", "parameters", "strict"}`) as
/// chat tools.
fn chat_tools(tools: &Value) -> Result<Vec<Value>, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(invalid("tools", "'tools' must be a list"));
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for field in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
                        function.insert(field.into(), v.clone());
                    }
                }
                out.push(json!({"type": "function", "function": function}));
            }
            // Checked by `mcp_tools::parse`; their tools join once listed.
            Some("mcp") => {}
            Some(other) => {
                return Err(ApiError::invalid_param(
                    &format!("tools[{i}].type"),
                    format!("tools of type '{other}' are not supported"),
                )
                .with_code("unsupported_value"))
            }
            None => return Err(invalid(&format!("tools[{i}].type"), "a tool needs a 'type'")),
        }
    }
    Ok(out)
}

fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(c) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.name", "a function tool choice needs a 'name'"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\"}",
        )
        .with_code("unsupported_value")),
    }
}

/// `text.format` as chat's `response_format` (None: plain text).
fn response_format(format: &Value) -> Result<Option<Value>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for field in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(field).filter(|v| !v.is_null()) {
                    schema.insert(field.into(), v.clone());
                }
            }
            if !schema.contains_key("schema") {
                return Err(invalid("text.format.schema", "a json_schema format needs a 'schema'")
                    .with_code("missing_required_parameter"));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(ApiError::invalid_param(
            "text.format.type",
            "text.format.type must be text, json_object or json_schema",
        )
        .with_code("invalid_value")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{chat_request, messages, parse};
    use crate::openai::request::PromptInput;

    fn body(v: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn string_input_is_one_user_message_after_the_instructions() {
        let req = parse(&body(json!({"model": "m", "input": "Hi", "instructions": "Be brief."}))).unwrap();
        assert!(req.store, "store defaults to true");
        assert_eq!(req.input.len(), 1);
        assert!(req.input[0]["id"].as_str().unwrap().starts_with("msg_"));
        let chat = chat_request(&req, &[]).unwrap();
        let PromptInput::Chat(input) = &chat.input else {
            panic!("chat")
        };
        assert_eq!(
            input.messages,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Hi"})
            ]
        );
    }

    #[test]
    fn function_calls_and_outputs_become_tool_calls_and_tool_messages() {
        let items = [
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}),
            json!({"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"Paris\"}"}),
            json!({"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "Sunny"}),
        ];
        let m = messages(None, &items);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[1]["tool_calls"].as_array().unwrap().len(),
            2,
            "one turn's calls in one message"
        );
        assert_eq!(m[1]["tool_calls"][0]["id"], "c1");
        assert_eq!(m[2], json!({"role": "tool", "tool_call_id": "c1", "content": "Sunny"}));
    }

    #[test]
    fn mcp_items_become_tool_calls_and_results() {
        let items = [
            json!({"type": "message", "role": "user", "content": "Add 1 and 2, then 3 and 4."}),
            json!({"type": "mcp_list_tools", "server_label": "calc", "tools": []}),
            json!({"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "add",
                "arguments": "{}", "output": "3", "error": null}),
            json!({"type": "mcp_call", "id": "mcp_2", "server_label": "calc", "name": "add",
                "arguments": "{}", "output": null, "error": "down"}),
            json!({"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "calc", "name": "add",
                "arguments": "{}"}),
            json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": false}),
            json!({"type": "mcp_approval_request", "id": "mcpr_2", "server_label": "calc", "name": "add",
                "arguments": "{}"}),
            json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_2", "approve": true}),
            json!({"type": "mcp_call", "id": "mcp_3", "approval_request_id": "mcpr_2", "server_label": "calc",
                "name": "add", "arguments": "{}", "output": "7", "error": null}),
        ];
        let m = messages(None, &items);
        let roles: Vec<&str> = m.iter().map(|m| m["role"].as_str().unwrap()).collect();
        // Calls with no message between them read as one turn: one assistant message, the results after.
        assert_eq!(
            roles,
            ["user", "assistant", "tool", "tool", "tool", "assistant", "tool"]
        );
        let ids = |m: &serde_json::Value| -> Vec<String> {
            m["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(ids(&m[1]), ["mcp_1", "mcp_2", "mcpr_1"]);
        assert_eq!(m[2], json!({"role": "tool", "tool_call_id": "mcp_1", "content": "3"}));
        assert_eq!(m[3]["content"], "Error: down");
        assert_eq!(
            m[4],
            json!({"role": "tool", "tool_call_id": "mcpr_1", "content": super::DENIED})
        );
        assert_eq!(ids(&m[5]), ["mcpr_2"], "the approved call is the request's");
        assert_eq!(m[6], json!({"role": "tool", "tool_call_id": "mcpr_2", "content": "7"}));
    }

    #[test]
    fn mcp_tools_join_the_chat_tools_once_listed() {
        let req = parse(&body(json!({
            "model": "m", "input": "Hi",
            "tools": [{"type": "mcp", "server_label": "calc", "server_url": "http://h/mcp"}],
        })))
        .unwrap();
        let tools = |chat: crate::openai::request::GenerationRequest| match chat.input {
            PromptInput::Chat(input) => input.tools,
            _ => panic!("chat"),
        };
        assert_eq!(tools(chat_request(&req, &[]).unwrap()), None, "nothing listed yet");
        let add = json!({"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}});
        let chat = super::chat_request_over(&req, &req.input, std::slice::from_ref(&add)).unwrap();
        assert_eq!(tools(chat), Some(json!([add])));
        let bad = json!({"model": "m", "input": [{"type": "mcp_approval_response", "approval_request_id": "x"}]});
        assert_eq!(
            parse(&body(bad)).unwrap_err().param.as_deref(),
            Some("input[0].approve")
        );
    }

    #[test]
    fn fields_map_to_the_chat_request() {
        let req = parse(&body(json!({
            "model": "m",
            "input": "Hi",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "function", "name": "f"},
        })))
        .unwrap();
        let chat = chat_request(&req, &[]).unwrap();
        assert_eq!(chat.sampling.max_tokens, Some(7));
        assert_eq!(chat.sampling.temperature, Some(0.5));
        assert!(chat.constraint.is_some(), "a forced tool choice constrains the output");
        let structured = parse(&body(json!({
            "model": "m", "input": "Hi",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        })))
        .unwrap();
        assert!(chat_request(&structured, &[]).unwrap().constraint.is_some());
    }

    #[test]
    fn bad_input_names_the_param() {
        let cases = [
            (json!({"input": "x"}), "model"),
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": [{"type": "image"}]}), "input[0].type"),
            (
                json!({"model": "m", "input": [{"role": "boss", "content": "x"}]}),
                "input[0].role",
            ),
            (
                json!({"model": "m", "input": "x", "conversation": "c", "previous_response_id": "r"}),
                "conversation",
            ),
            (json!({"model": "m", "input": "x", "background": true}), "background"),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}),
                "text.format.type",
            ),
        ];
        for (b, param) in cases {
            let e = parse(&body(b.clone())).and_then(|r| chat_request(&r, &[])).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{b}");
        }
        let req = parse(&body(json!({"model": "m", "input": "x", "max_output_tokens": 0}))).unwrap();
        assert_eq!(
            chat_request(&req, &[]).unwrap_err().param.as_deref(),
            Some("max_output_tokens")
        );
    }

    #[test]
    fn content_parts_are_text_or_refused_by_name() {
        let message = |role: &str, parts: serde_json::Value| json!({"model": "m", "input": [{"type": "message", "role": role, "content": parts}]});
        let text = json!({"type": "input_text", "text": "a"});
        // (role, second part, the param a 400 names; None: accepted)
        let cases = [
            ("user", json!({"type": "input_text", "text": "b"}), None),
            ("user", json!({"type": "text", "text": "b"}), None),
            (
                "assistant",
                json!({"type": "output_text", "text": "b", "annotations": []}),
                None,
            ),
            ("assistant", json!({"type": "refusal", "refusal": "b"}), None),
            (
                "user",
                json!({"type": "input_image", "image_url": "https://x/y.png"}),
                Some("input[0].content[1].type"),
            ),
            (
                "user",
                json!({"type": "input_image", "file_id": "file-1"}),
                Some("input[0].content[1].type"),
            ),
            (
                "user",
                json!({"type": "input_file", "file_data": "data:application/pdf;base64,AA=="}),
                Some("input[0].content[1].type"),
            ),
            (
                "user",
                json!({"type": "input_audio", "input_audio": {}}),
                Some("input[0].content[1].type"),
            ),
            (
                "user",
                json!({"type": "refusal", "refusal": "b"}),
                Some("input[0].content[1].type"),
            ),
            ("user", json!({"type": "video"}), Some("input[0].content[1].type")),
            ("user", json!({"text": "b"}), Some("input[0].content[1].type")),
            ("user", json!("b"), Some("input[0].content[1]")),
            ("user", json!({"type": "input_text"}), Some("input[0].content[1].text")),
            (
                "assistant",
                json!({"type": "refusal", "text": "b"}),
                Some("input[0].content[1].refusal"),
            ),
        ];
        for (role, part, param) in cases {
            let parsed = parse(&body(message(role, json!([text.clone(), part.clone()]))));
            match param {
                None => {
                    let req = parsed.unwrap_or_else(|e| panic!("{part}: {e:?}"));
                    let chat = chat_request(&req, &[]).unwrap();
                    let PromptInput::Chat(input) = &chat.input else {
                        panic!("chat")
                    };
                    // Both parts' text reach the prompt: nothing dropped.
                    assert_eq!(input.messages[0]["content"], "ab", "{part}");
                }
                Some(param) => {
                    let e = parsed.unwrap_err();
                    assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{part}");
                }
            }
        }
        let e = parse(&body(message(
            "user",
            json!([{"type": "input_image", "image_url": "x"}]),
        )))
        .unwrap_err();
        assert!(e.message.contains("text only"), "{}", e.message);
    }
}
