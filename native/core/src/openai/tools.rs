//! A chat request's `tools`, `tool_choice` and `parallel_tool_calls`: validated before any engine call,
//! and a forced choice (`required`, or a named function) turned into the JSON-schema constraint of the
//! call(s) the model must write.
//!
//! The forced output is JSON the response side parses back into `tool_calls`:
//! - named `f`: one object `{"name": "f", "parameters": {...}}` (schema: `name` a `const`);
//! - `required`: a non-empty array of such objects (schema: `minItems` 1, `maxItems` 1 when
//!   `parallel_tool_calls` is false, items `anyOf` one object per tool with `name` an `enum` of that one
//!   tool's name).
//!
//! Each tool's `$defs` (and `definitions`) move to the root of the built schema, where the tool's
//! `#/$defs/...` references resolve; two tools defining one name differently cannot share that root (400).

use serde_json::{json, Map, Value};

use super::codes::{refuse, CONFLICT, INVALID_TYPE, INVALID_VALUE, MISSING};
use super::fields::{opt_bool, Object};
use super::schema::check_schema_object;
use super::structured::ToolChoice;
use crate::error::ApiError;

/// One validated function tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The arguments' JSON Schema, when the tool has one.
    pub parameters: Option<Value>,
}

/// What a chat request says about tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel_tool_calls: bool,
}

/// The keywords under which a schema keeps definitions its `$ref`s point to from the root.
const DEFINITION_KEYS: [&str; 2] = ["$defs", "definitions"];

/// `^[a-zA-Z0-9_-]{1,64}$`, OpenAI's rule for function names.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn parse_tool_request(obj: &Object) -> Result<ToolRequest, ApiError> {
    let tools = parse_tools(obj)?;
    let choice = parse_tool_choice(obj, &tools)?;
    let parallel_tool_calls = opt_bool(obj, "parallel_tool_calls")
        .map_err(|e| e.with_code(INVALID_TYPE))?
        .unwrap_or(true);
    Ok(ToolRequest {
        tools,
        choice,
        parallel_tool_calls,
    })
}

fn parse_tools(obj: &Object) -> Result<Vec<Tool>, ApiError> {
    let list = match obj.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(refuse("tools", INVALID_TYPE, "'tools' must be a list")),
    };
    if list.is_empty() {
        return Err(refuse(
            "tools",
            INVALID_VALUE,
            "'tools' must not be an empty list: give at least one tool or leave the field out",
        ));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let tool = parse_tool(item, &format!("tools[{i}]"))?;
        if tools.iter().any(|t| t.name == tool.name) {
            return Err(refuse(
                &format!("tools[{i}].function.name"),
                INVALID_VALUE,
                format!("tool names must be unique: '{}' is given twice", tool.name),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn parse_tool(item: &Value, param: &str) -> Result<Tool, ApiError> {
    let tool = item
        .as_object()
        .ok_or_else(|| refuse(param, INVALID_TYPE, format!("'{param}' must be an object")))?;
    match tool.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        None | Some(Value::Null) => {
            return Err(refuse(
                &format!("{param}.type"),
                MISSING,
                format!("'{param}.type' is required"),
            ))
        }
        Some(other) => {
            return Err(refuse(
                &format!("{param}.type"),
                INVALID_VALUE,
                format!("'{param}.type' must be 'function', got {other}"),
            ))
        }
    }
    let at = format!("{param}.function");
    let function = match tool.get("function") {
        None | Some(Value::Null) => return Err(refuse(&at, MISSING, format!("'{at}' is required"))),
        Some(Value::Object(f)) => f,
        Some(_) => return Err(refuse(&at, INVALID_TYPE, format!("'{at}' must be an object"))),
    };
    let name_at = format!("{at}.name");
    let name = match function.get("name") {
        None | Some(Value::Null) => return Err(refuse(&name_at, MISSING, format!("'{name_at}' is required"))),
        Some(Value::String(name)) => name,
        Some(_) => return Err(refuse(&name_at, INVALID_TYPE, format!("'{name_at}' must be a string"))),
    };
    if !is_valid_name(name) {
        return Err(refuse(
            &name_at,
            INVALID_VALUE,
            format!("'{name_at}' must match ^[a-zA-Z0-9_-]{{1,64}}$, got '{name}'"),
        ));
    }
    for (key, kind) in [("description", "a string"), ("strict", "a boolean")] {
        let ok = match function.get(key) {
            None | Some(Value::Null) => true,
            Some(v) => (key == "description" && v.is_string()) || (key == "strict" && v.is_boolean()),
        };
        if !ok {
            let p = format!("{at}.{key}");
            return Err(refuse(&p, INVALID_TYPE, format!("'{p}' must be {kind}")));
        }
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => None,
        Some(schema) => {
            check_schema_object(schema, &format!("{at}.parameters"))?;
            Some(schema.clone())
        }
    };
    Ok(Tool {
        name: name.clone(),
        parameters,
    })
}

/// `tool_choice`: "none" | "auto" | "required" | `{"type": "function", "function": {"name": ...}}`
/// naming one of `tools`. Absent: `Auto` with tools, `None` without.
fn parse_tool_choice(obj: &Object, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            })
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(refuse(
                    "tool_choice",
                    INVALID_VALUE,
                    format!("'tool_choice' must be 'none', 'auto', 'required' or a named function, got '{other}'"),
                ))
            }
        },
        Some(Value::Object(named)) => ToolChoice::Named(parse_named_choice(named)?),
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                INVALID_TYPE,
                "'tool_choice' must be a string or an object",
            ))
        }
    };
    if tools.is_empty() && choice.is_forced() {
        return Err(refuse(
            "tool_choice",
            MISSING,
            "'tool_choice' 'required' or a named function needs 'tools'",
        ));
    }
    if let ToolChoice::Named(name) = &choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(refuse(
                "tool_choice.function.name",
                INVALID_VALUE,
                format!("'tool_choice' names function '{name}', which is not in 'tools'"),
            ));
        }
    }
    Ok(choice)
}

fn parse_named_choice(named: &Object) -> Result<String, ApiError> {
    match named.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        _ => {
            return Err(refuse(
                "tool_choice.type",
                INVALID_VALUE,
                "'tool_choice.type' must be 'function'",
            ))
        }
    }
    let function = named.get("function").and_then(Value::as_object).ok_or_else(|| {
        refuse(
            "tool_choice.function",
            MISSING,
            r#"'tool_choice.function' is required: {"type": "function", "function": {"name": "..."}}"#,
        )
    })?;
    match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => Ok(name.clone()),
        _ => Err(refuse(
            "tool_choice.function.name",
            MISSING,
            "'tool_choice.function.name' must be a function name",
        )),
    }
}

/// The JSON Schema (serialized) that a forced tool choice constrains the output to; `None` when the
/// choice is not forced.
pub fn forced_tool_schema(request: &ToolRequest) -> Result<Option<String>, ApiError> {
    let mut defs = Map::new();
    let schema = match &request.choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Named(name) => {
            let (i, tool) = request
                .tools
                .iter()
                .enumerate()
                .find(|(_, t)| &t.name == name)
                .expect("parse_tool_choice checked the name");
            call_schema(i, tool, json!({"type": "string", "const": name}), &mut defs)?
        }
        ToolChoice::Required => {
            let calls = request
                .tools
                .iter()
                .enumerate()
                .map(|(i, tool)| call_schema(i, tool, json!({"type": "string", "enum": [tool.name]}), &mut defs))
                .collect::<Result<Vec<_>, _>>()?;
            let mut array = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
            if !request.parallel_tool_calls {
                array["maxItems"] = json!(1);
            }
            array
        }
    };
    let mut schema = schema;
    for (key, found) in defs {
        schema[key] = found;
    }
    Ok(Some(serde_json::to_string(&schema).expect("a JSON value serializes")))
}

/// `{"name": <name_schema>, "parameters": <the tool's schema>}`, the tool's definitions moved to `defs`.
fn call_schema(
    index: usize,
    tool: &Tool,
    name_schema: Value,
    defs: &mut Map<String, Value>,
) -> Result<Value, ApiError> {
    let mut parameters = tool
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    if let Value::Object(schema) = &mut parameters {
        for key in DEFINITION_KEYS {
            let Some(Value::Object(found)) = schema.remove(key) else {
                continue;
            };
            let root = defs
                .entry(key)
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("an object");
            for (name, def) in found {
                match root.get(&name) {
                    Some(existing) if existing != &def => {
                        return Err(refuse(
                            &format!("tools[{index}].function.parameters.{key}.{name}"),
                            CONFLICT,
                            format!(
                            "tools define '{key}.{name}' differently; a forced tool choice needs one definition of it"
                        ),
                        ))
                    }
                    _ => {
                        root.insert(name, def);
                    }
                }
            }
        }
    }
    Ok(json!({
        "type": "object",
        "properties": {"name": name_schema, "parameters": parameters},
        "required": ["name", "parameters"],
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::openai::request::{parse_chat_request, Constraint, GenerationRequest, ToolChoice};

    fn chat(extra: serde_json::Value) -> Result<GenerationRequest, crate::error::ApiError> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        parse_chat_request(body.to_string().as_bytes())
    }

    fn tool(name: &str, parameters: serde_json::Value) -> serde_json::Value {
        json!({"type": "function", "function": {"name": name, "parameters": parameters}})
    }

    fn weather() -> serde_json::Value {
        tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        )
    }

    fn schema(r: &GenerationRequest) -> serde_json::Value {
        match &r.constraint {
            Some(Constraint::JsonSchema(s)) => serde_json::from_str(s).unwrap(),
            other => panic!("expected a JSON schema constraint, got {other:?}"),
        }
    }

    #[test]
    fn tool_choice_defaults_follow_the_tools() {
        let r = chat(json!({})).unwrap();
        assert_eq!(
            (r.tool_choice, r.parallel_tool_calls, r.constraint),
            (ToolChoice::None, true, None)
        );
        let r = chat(json!({"tools": [weather()]})).unwrap();
        assert_eq!((r.tool_choice, r.constraint), (ToolChoice::Auto, None));
        let r = chat(json!({"tools": [weather()], "tool_choice": "none", "parallel_tool_calls": false})).unwrap();
        assert_eq!((r.tool_choice, r.parallel_tool_calls), (ToolChoice::None, false));
        // "auto" and "none" without tools ask for nothing a request cannot do.
        assert_eq!(
            chat(json!({"tool_choice": "auto"})).unwrap().tool_choice,
            ToolChoice::Auto
        );
    }

    #[test]
    fn a_named_choice_constrains_to_one_call_object() {
        let r = chat(json!({"tools": [weather(), tool("other", json!({"type": "object"}))],
                            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
        .unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(
            schema(&r),
            json!({"type": "object",
                   "properties": {"name": {"type": "string", "const": "get_weather"},
                                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}},
                   "required": ["name", "parameters"]})
        );
    }

    #[test]
    fn required_constrains_to_an_array_of_calls_one_when_not_parallel() {
        let tools = json!([weather(), {"type": "function", "function": {"name": "now"}}]);
        let r = chat(json!({"tools": tools, "tool_choice": "required"})).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Required);
        let s = schema(&r);
        assert_eq!((s["type"].clone(), s["minItems"].clone()), (json!("array"), json!(1)));
        assert!(s.get("maxItems").is_none());
        let calls = s["items"]["anyOf"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0]["properties"]["name"],
            json!({"type": "string", "enum": ["get_weather"]})
        );
        assert_eq!(calls[0]["properties"]["parameters"]["required"], json!(["city"]));
        // A tool without parameters takes an object of no particular properties.
        assert_eq!(
            calls[1]["properties"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
        let one = chat(json!({"tools": tools, "tool_choice": "required", "parallel_tool_calls": false})).unwrap();
        assert_eq!(schema(&one)["maxItems"], json!(1));
    }

    #[test]
    fn definitions_move_to_the_root_and_may_not_conflict() {
        let with_defs = |name: &str, def: serde_json::Value| {
            tool(
                name,
                json!({"type": "object", "properties": {"u": {"$ref": "#/$defs/Unit"}},
                              "$defs": {"Unit": def}}),
            )
        };
        let same = json!({"enum": ["C", "F"]});
        let r = chat(
            json!({"tools": [with_defs("a", same.clone()), with_defs("b", same.clone())],
                            "tool_choice": "required"}),
        )
        .unwrap();
        let s = schema(&r);
        assert_eq!(s["$defs"], json!({"Unit": same}));
        assert!(s["items"]["anyOf"][0]["properties"]["parameters"]
            .get("$defs")
            .is_none());
        let named = chat(json!({"tools": [with_defs("a", same.clone())],
                                "tool_choice": {"type": "function", "function": {"name": "a"}}}))
        .unwrap();
        assert_eq!(schema(&named)["$defs"], json!({"Unit": same}));
        let e = chat(
            json!({"tools": [with_defs("a", same), with_defs("b", json!({"enum": ["K"]}))],
                            "tool_choice": "required"}),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[1].function.parameters.$defs.Unit"));
        assert_eq!(e.code, Some("conflicting_parameters"));
    }

    #[test]
    fn invalid_tools_and_choices_name_the_parameter_with_a_code() {
        let cases = [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": []}), "tools"),
            (json!({"tools": [5]}), "tools[0]"),
            (json!({"tools": [{"function": {"name": "f"}}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
                "tools[0].type",
            ),
            (json!({"tools": [{"type": "function"}]}), "tools[0].function"),
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": 3}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [tool("get weather", json!({}))]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [tool(&"x".repeat(65), json!({}))]}),
                "tools[0].function.name",
            ),
            (json!({"tools": [weather(), weather()]}), "tools[1].function.name"),
            (
                json!({"tools": [tool("f", json!("object"))]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [tool("f", json!({"type": "dict"}))]}),
                "tools[0].function.parameters.type",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}),
                "tools[0].function.strict",
            ),
            (json!({"tools": [weather()], "tool_choice": "any"}), "tool_choice"),
            (json!({"tools": [weather()], "tool_choice": 1}), "tool_choice"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice.function.name",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function"}}),
                "tool_choice.function",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "x", "function": {"name": "get_weather"}}}),
                "tool_choice.type",
            ),
            (
                json!({"tools": [weather()], "parallel_tool_calls": "no"}),
                "parallel_tool_calls",
            ),
        ];
        for (extra, param) in cases {
            let e = chat(extra.clone()).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{extra}");
            assert!(e.code.is_some(), "{extra}: {e:?}");
        }
    }
}
