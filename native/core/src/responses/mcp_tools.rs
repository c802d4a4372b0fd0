//! MCP tool definitions of a Responses request (`{"type": "mcp", "server_label", "server_url",
//! "allowed_tools", "require_approval", "headers"}`), checked before anything is called: a bad definition
//! is a 400 naming the field. A server's tools reach the model as plain function tools (`function_tool`), so
//! the model's tool-call parser reads a call to one like any other; the tool loop (`tool_loop.rs`) tells the
//! two kinds apart by name.
//!
//! `require_approval` follows OpenAI: `"always"` (the default), `"never"`, or
//! `{"always": {"tool_names": [...]}, "never": {"tool_names": [...]}}`, where a tool named in neither list
//! needs approval. `allowed_tools` is a list of names or `{"tool_names": [...]}`.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use super::mcp::{check_url, McpTool};
use crate::error::ApiError;

/// When a call to one of a server's tools waits for the client's approval.
#[derive(Debug, Clone, PartialEq)]
pub enum Approval {
    Always,
    Never,
    /// Only the tools in `never` run without approval.
    Listed {
        never: HashSet<String>,
        always: HashSet<String>,
    },
}

/// One MCP server the request offers the model.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerDef {
    pub label: String,
    pub url: String,
    /// None: every tool the server lists.
    pub allowed: Option<HashSet<String>>,
    pub approval: Approval,
    /// Sent with every request to the server (an Authorization, say); never echoed back nor stored.
    pub headers: Vec<(String, String)>,
}

impl McpServerDef {
    pub fn allows(&self, tool: &str) -> bool {
        self.allowed.as_ref().is_none_or(|a| a.contains(tool))
    }

    pub fn needs_approval(&self, tool: &str) -> bool {
        match &self.approval {
            Approval::Always => true,
            Approval::Never => false,
            Approval::Listed { never, always } => always.contains(tool) || !never.contains(tool),
        }
    }
}

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message).with_code("invalid_value")
}

/// Whether `tools` holds an MCP tool.
pub fn any(body: &Map<String, Value>) -> bool {
    body.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|tools| tools.iter().any(is_mcp))
}

pub fn is_mcp(tool: &Value) -> bool {
    tool.get("type").and_then(Value::as_str) == Some("mcp")
}

/// The MCP servers of the request's `tools`, in order.
pub fn parse(body: &Map<String, Value>) -> Result<Vec<McpServerDef>, ApiError> {
    let Some(Value::Array(tools)) = body.get("tools") else {
        return Ok(Vec::new());
    };
    let mut servers: Vec<McpServerDef> = Vec::new();
    for (i, tool) in tools.iter().enumerate().filter(|(_, t)| is_mcp(t)) {
        let at = |field: &str| format!("tools[{i}].{field}");
        let string =
            |field: &str| match tool.get(field) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                None | Some(Value::Null) => Err(invalid(&at(field), format!("an MCP tool needs a '{field}'"))
                    .with_code("missing_required_parameter")),
                Some(_) => Err(invalid(&at(field), format!("'{field}' must be a non-empty string"))),
            };
        let label = string("server_label")?;
        if servers.iter().any(|s| s.label == label) {
            return Err(invalid(
                &at("server_label"),
                format!("two MCP tools are labelled '{label}'; labels must be unique"),
            ));
        }
        let url = string("server_url")?;
        check_url(&url).map_err(|e| invalid(&at("server_url"), e.to_string()))?;
        let allowed = match tool.get("allowed_tools") {
            None | Some(Value::Null) => None,
            Some(Value::Object(filter)) => Some(names(filter.get("tool_names"), &at("allowed_tools.tool_names"))?),
            Some(list) => Some(names(Some(list), &at("allowed_tools"))?),
        };
        let approval =
            match tool.get("require_approval") {
                None | Some(Value::Null) => Approval::Always,
                Some(Value::String(s)) if s == "always" => Approval::Always,
                Some(Value::String(s)) if s == "never" => Approval::Never,
                Some(Value::Object(o)) => {
                    let listed = |key: &str| match o.get(key) {
                        None | Some(Value::Null) => Ok(HashSet::new()),
                        Some(Value::Object(filter)) => names(
                            filter.get("tool_names"),
                            &at(&format!("require_approval.{key}.tool_names")),
                        ),
                        Some(_) => Err(invalid(
                            &at(&format!("require_approval.{key}")),
                            "must be {\"tool_names\": [...]}",
                        )),
                    };
                    Approval::Listed {
                        never: listed("never")?,
                        always: listed("always")?,
                    }
                }
                Some(_) => return Err(invalid(
                    &at("require_approval"),
                    "require_approval must be \"always\", \"never\" or {\"always\"|\"never\": {\"tool_names\": [...]}}",
                )),
            };
        let headers = match tool.get("headers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(h)) => h
                .iter()
                .map(|(name, value)| match value {
                    Value::String(v) => Ok((name.clone(), v.clone())),
                    _ => Err(invalid(
                        &at(&format!("headers.{name}")),
                        "header values must be strings",
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid(&at("headers"), "'headers' must be an object of strings")),
        };
        servers.push(McpServerDef {
            label,
            url,
            allowed,
            approval,
            headers,
        });
    }
    Ok(servers)
}

fn names(list: Option<&Value>, param: &str) -> Result<HashSet<String>, ApiError> {
    match list {
        Some(Value::Array(items)) => items
            .iter()
            .map(|n| {
                n.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| invalid(param, "tool names must be strings"))
            })
            .collect(),
        _ => Err(invalid(param, "must be a list of tool names")),
    }
}

/// A listed tool as `mcp_list_tools` shows it.
pub fn listed_tool(tool: &McpTool) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "annotations": tool.annotations,
    })
}

/// A listed tool (`mcp_list_tools`' shape) as a chat function tool.
pub fn function_tool(listed: &Value) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), listed["name"].clone());
    if let Some(description) = listed.get("description").filter(|d| d.is_string()) {
        function.insert("description".into(), description.clone());
    }
    let parameters = match listed.get("input_schema") {
        Some(schema @ Value::Object(_)) => schema.clone(),
        _ => json!({"type": "object", "properties": {}}),
    };
    function.insert("parameters".into(), parameters);
    json!({"type": "function", "function": function})
}

/// The request's tools as the Response echoes and stores them: MCP headers (credentials) left out.
pub fn redacted_tools(tools: &Value) -> Value {
    let mut tools = tools.clone();
    for tool in tools.as_array_mut().into_iter().flatten().filter(|t| is_mcp(t)) {
        if tool.get("headers").is_some_and(|h| !h.is_null()) {
            tool["headers"] = Value::Null;
        }
    }
    tools
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::{parse, redacted_tools, Approval};

    fn body(tools: Value) -> Map<String, Value> {
        json!({"tools": tools}).as_object().unwrap().clone()
    }

    #[test]
    fn a_full_definition_parses() {
        let servers = parse(&body(json!([
            {"type": "function", "name": "f"},
            {"type": "mcp", "server_label": "calc", "server_url": "http://127.0.0.1:9/mcp",
             "allowed_tools": ["add"], "require_approval": {"never": {"tool_names": ["add"]}},
             "headers": {"Authorization": "Bearer x"}},
            {"type": "mcp", "server_label": "other", "server_url": "http://h/mcp",
             "allowed_tools": {"tool_names": ["x"]}, "require_approval": "never"},
        ])))
        .unwrap();
        assert_eq!(servers.len(), 2);
        let calc = &servers[0];
        assert!(calc.allows("add") && !calc.allows("fail"));
        assert!(!calc.needs_approval("add"), "listed under never");
        assert!(calc.needs_approval("fail"), "listed nowhere: approval");
        assert_eq!(
            calc.headers,
            vec![("Authorization".to_string(), "Bearer x".to_string())]
        );
        assert_eq!(servers[1].approval, Approval::Never);
        assert!(servers[1].allows("x"));
        let default = parse(&body(
            json!([{"type": "mcp", "server_label": "a", "server_url": "http://h"}]),
        ))
        .unwrap();
        assert!(default[0].needs_approval("anything"), "OpenAI's default: always");
        assert!(default[0].allows("anything"));
    }

    #[test]
    fn bad_definitions_name_the_field() {
        let cases = [
            (
                json!([{"type": "mcp", "server_url": "http://h"}]),
                "tools[0].server_label",
            ),
            (
                json!([{"type": "function", "name": "f"}, {"type": "mcp", "server_label": "a"}]),
                "tools[1].server_url",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "ftp://h/x"}]),
                "tools[0].server_url",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "not a url"}]),
                "tools[0].server_url",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "http://h"},
                       {"type": "mcp", "server_label": "a", "server_url": "http://g"}]),
                "tools[1].server_label",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "http://h", "require_approval": "sometimes"}]),
                "tools[0].require_approval",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "http://h", "allowed_tools": [1]}]),
                "tools[0].allowed_tools",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "http://h", "headers": {"k": 1}}]),
                "tools[0].headers.k",
            ),
        ];
        for (tools, param) in cases {
            let e = parse(&body(tools.clone())).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{tools}");
        }
    }

    #[test]
    fn headers_are_not_echoed() {
        let tools = json!([{"type": "mcp", "server_label": "a", "headers": {"Authorization": "secret"}}]);
        assert_eq!(redacted_tools(&tools)[0]["headers"], Value::Null);
    }
}
