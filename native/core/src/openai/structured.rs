//! Structured-output requests: the tool choice and the one decoding constraint a request may carry
//! (`response_format`, vLLM's `structured_outputs` and `guided_*` extras, or a forced tool call).

use serde_json::Value;

use super::codes::{refuse, CONFLICT, INVALID_TYPE, INVALID_VALUE, MISSING, UNSUPPORTED_PARAMETER};
use super::fields::Object;
use super::schema::check_schema_object;
use crate::error::ApiError;

/// Which tool calls the model may or must make (OpenAI's `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No tool call: the default when the request has no tools.
    #[default]
    None,
    /// The model decides: the default when the request has tools.
    Auto,
    /// At least one call: the output is constrained to a JSON array of calls (see `forced_tool_schema`).
    Required,
    /// Exactly one call of this function: the output is constrained to one JSON call object.
    Named(String),
}

impl ToolChoice {
    /// Whether the output is constrained to tool-call JSON rather than parsed from free text.
    pub fn is_forced(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Named(_))
    }
}

/// The one constraint on what the engine may generate, in the form both engine protocols take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// A JSON Schema, serialized (`json_object` is `{"type":"object"}`).
    JsonSchema(String),
    Regex(String),
    /// An EBNF grammar (as the engine's grammar backend reads it).
    Grammar(String),
    /// One of these strings exactly.
    Choice(Vec<String>),
    /// A structural tag, serialized JSON.
    StructuralTag(String),
}

/// `{"type":"object"}`: what `json_object` (and vLLM's `structured_outputs.json_object`) asks for.
pub const ANY_JSON_OBJECT: &str = r#"{"type":"object"}"#;

/// The legacy vLLM extras, in the order they are checked (one constraint each).
const GUIDED: [&str; 4] = ["guided_json", "guided_regex", "guided_choice", "guided_grammar"];
/// Kinds of `structured_outputs`, exactly one of which is given.
const STRUCTURED_KINDS: [&str; 6] = ["json", "regex", "choice", "grammar", "structural_tag", "json_object"];
/// `structured_outputs` options that change the output and are not sent to the engines: refused unless
/// left at their defaults (false / absent).
const STRUCTURED_OPTIONS_REFUSED: [&str; 4] = [
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
];

/// The one output constraint of a request, from `forced` (a forced tool choice's schema, already built)
/// and the client's `response_format`, `structured_outputs` and `guided_*`. Two of them → 400 naming
/// the second.
pub fn parse_constraint(obj: &Object, forced: Option<String>) -> Result<Option<Constraint>, ApiError> {
    let mut given: Vec<(String, Constraint)> = Vec::new();
    if let Some(schema) = forced {
        given.push(("tool_choice".into(), Constraint::JsonSchema(schema)));
    }
    if let Some(c) = parse_response_format(obj)? {
        given.push(("response_format".into(), c));
    }
    if let Some((kind, c)) = parse_structured_outputs(obj)? {
        given.push((format!("structured_outputs.{kind}"), c));
    }
    for name in GUIDED {
        if let Some(c) = parse_guided(obj, name)? {
            given.push((name.into(), c));
        }
    }
    if given.len() > 1 {
        let (first, second) = (&given[0].0, &given[1].0);
        return Err(refuse(
            second,
            CONFLICT,
            format!("'{second}' cannot be combined with '{first}': a request takes at most one output constraint"),
        ));
    }
    Ok(given.pop().map(|(_, c)| c))
}

/// `response_format`: `{"type": "text" | "json_object" | "json_schema" | "structural_tag", ...}`.
fn parse_response_format(obj: &Object) -> Result<Option<Constraint>, ApiError> {
    let format = match obj.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(_) => {
            return Err(refuse(
                "response_format",
                INVALID_TYPE,
                "'response_format' must be an object",
            ))
        }
    };
    let kind = match format.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        None | Some(Value::Null) => {
            return Err(refuse(
                "response_format.type",
                MISSING,
                "'response_format.type' is required",
            ))
        }
        Some(_) => {
            return Err(refuse(
                "response_format.type",
                INVALID_TYPE,
                "'response_format.type' must be a string",
            ))
        }
    };
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Constraint::JsonSchema(ANY_JSON_OBJECT.into()))),
        "json_schema" => parse_json_schema_format(format).map(Some),
        // vLLM's extension: the whole object is the engine's structural tag.
        "structural_tag" => {
            let shaped = format.get("format").is_some_and(Value::is_object)
                || (format.get("structures").is_some_and(Value::is_array)
                    && format.get("triggers").is_some_and(Value::is_array));
            if !shaped {
                return Err(refuse(
                    "response_format",
                    INVALID_VALUE,
                    "a 'structural_tag' response_format needs 'format', or 'structures' and 'triggers'",
                ));
            }
            Ok(Some(Constraint::StructuralTag(to_json(&Value::Object(format.clone())))))
        }
        other => Err(refuse(
            "response_format.type",
            INVALID_VALUE,
            format!("'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{other}'"),
        )),
    }
}

fn parse_json_schema_format(format: &Object) -> Result<Constraint, ApiError> {
    const AT: &str = "response_format.json_schema";
    let spec = match format.get("json_schema") {
        Some(Value::Object(spec)) => spec,
        None | Some(Value::Null) => {
            return Err(refuse(
                AT,
                MISSING,
                "'response_format.json_schema' is required for type 'json_schema'",
            ))
        }
        Some(_) => {
            return Err(refuse(
                AT,
                INVALID_TYPE,
                "'response_format.json_schema' must be an object",
            ))
        }
    };
    match spec.get("name") {
        Some(Value::String(name)) if super::tools::is_valid_name(name) => {}
        Some(Value::String(name)) => {
            return Err(refuse(
                "response_format.json_schema.name",
                INVALID_VALUE,
                format!("'response_format.json_schema.name' must match ^[a-zA-Z0-9_-]{{1,64}}$, got '{name}'"),
            ))
        }
        None | Some(Value::Null) => {
            return Err(refuse(
                "response_format.json_schema.name",
                MISSING,
                "'response_format.json_schema.name' is required",
            ))
        }
        Some(_) => {
            return Err(refuse(
                "response_format.json_schema.name",
                INVALID_TYPE,
                "'response_format.json_schema.name' must be a string",
            ))
        }
    }
    if spec.get("strict").is_some_and(|s| !s.is_null() && !s.is_boolean()) {
        return Err(refuse(
            "response_format.json_schema.strict",
            INVALID_TYPE,
            "'response_format.json_schema.strict' must be a boolean",
        ));
    }
    let schema = match spec.get("schema") {
        None | Some(Value::Null) => {
            return Err(refuse(
                "response_format.json_schema.schema",
                MISSING,
                "'response_format.json_schema.schema' is required",
            ))
        }
        Some(schema) => schema,
    };
    check_schema_object(schema, "response_format.json_schema.schema")?;
    Ok(Constraint::JsonSchema(to_json(schema)))
}

/// vLLM's `structured_outputs`: exactly one of `STRUCTURED_KINDS`; returns that kind's name too.
fn parse_structured_outputs(obj: &Object) -> Result<Option<(&'static str, Constraint)>, ApiError> {
    let spec = match obj.get("structured_outputs") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(spec)) => spec,
        Some(_) => {
            return Err(refuse(
                "structured_outputs",
                INVALID_TYPE,
                "'structured_outputs' must be an object",
            ))
        }
    };
    for option in STRUCTURED_OPTIONS_REFUSED {
        if spec
            .get(option)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            let at = format!("structured_outputs.{option}");
            return Err(refuse(&at, UNSUPPORTED_PARAMETER, format!("'{at}' is not supported")));
        }
    }
    let mut found: Option<(&'static str, Constraint)> = None;
    for kind in STRUCTURED_KINDS {
        let at = format!("structured_outputs.{kind}");
        let constraint = match (kind, spec.get(kind)) {
            (_, None | Some(Value::Null)) | ("json_object", Some(Value::Bool(false))) => continue,
            ("json_object", Some(Value::Bool(true))) => Constraint::JsonSchema(ANY_JSON_OBJECT.into()),
            ("json_object", Some(_)) => return Err(refuse(&at, INVALID_TYPE, format!("'{at}' must be a boolean"))),
            ("json", Some(v)) => json_schema_value(v, &at)?,
            ("regex", Some(v)) => Constraint::Regex(regex_pattern(v, &at)?),
            ("grammar", Some(v)) => Constraint::Grammar(non_empty_string(v, &at)?),
            ("structural_tag", Some(v)) => Constraint::StructuralTag(non_empty_string(v, &at)?),
            ("choice", Some(v)) => Constraint::Choice(choices(v, &at)?),
            _ => unreachable!("every kind is matched"),
        };
        if let Some((first, _)) = &found {
            return Err(refuse(
                &at,
                CONFLICT,
                format!("'structured_outputs' takes one kind of constraint: '{kind}' given with '{first}'"),
            ));
        }
        found = Some((kind, constraint));
    }
    match found {
        Some(found) => Ok(Some(found)),
        None => Err(refuse(
            "structured_outputs",
            MISSING,
            "'structured_outputs' needs one of 'json', 'regex', 'choice', 'grammar', 'structural_tag', 'json_object'",
        )),
    }
}

/// One legacy `guided_*` field.
fn parse_guided(obj: &Object, name: &str) -> Result<Option<Constraint>, ApiError> {
    let Some(v) = obj.get(name).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    Ok(Some(match name {
        "guided_json" => json_schema_value(v, name)?,
        "guided_regex" => Constraint::Regex(regex_pattern(v, name)?),
        "guided_choice" => Constraint::Choice(choices(v, name)?),
        "guided_grammar" => Constraint::Grammar(non_empty_string(v, name)?),
        _ => unreachable!("GUIDED names"),
    }))
}

/// A regex constraint's pattern: a non-empty string whose syntax is not surely broken. The engines' regex
/// dialects (outlines, xgrammar, llguidance) differ from each other and from Rust's, so only errors that
/// every dialect shares are refused (unbalanced parentheses or brackets, a repetition with nothing to
/// repeat, an unfinished escape or count, a reversed range); look-arounds, back-references and unknown
/// flags are left to the engine.
fn regex_pattern(v: &Value, at: &str) -> Result<String, ApiError> {
    use regex_syntax::ast::ErrorKind as E;
    let pattern = non_empty_string(v, at)?;
    let Err(e) = regex_syntax::ast::parse::Parser::new().parse(&pattern) else {
        return Ok(pattern);
    };
    let surely_invalid = matches!(
        e.kind(),
        E::GroupUnclosed
            | E::GroupUnopened
            | E::ClassUnclosed
            | E::ClassRangeInvalid
            | E::RepetitionMissing
            | E::RepetitionCountUnclosed
            | E::RepetitionCountInvalid
            | E::EscapeUnexpectedEof
    );
    if !surely_invalid {
        return Ok(pattern);
    }
    Err(refuse(
        at,
        INVALID_VALUE,
        format!(
            "'{at}' is not a valid regular expression: {} (at offset {})",
            e.kind(),
            e.span().start.offset
        ),
    ))
}

/// A JSON Schema given as an object or as its serialized text.
fn json_schema_value(v: &Value, at: &str) -> Result<Constraint, ApiError> {
    let parsed;
    let schema = match v {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| refuse(at, INVALID_VALUE, format!("'{at}' is not valid JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    check_schema_object(schema, at)?;
    Ok(Constraint::JsonSchema(to_json(schema)))
}

fn non_empty_string(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::String(_) => Err(refuse(at, INVALID_VALUE, format!("'{at}' must not be empty"))),
        _ => Err(refuse(at, INVALID_TYPE, format!("'{at}' must be a string"))),
    }
}

fn choices(v: &Value, at: &str) -> Result<Vec<String>, ApiError> {
    let list = v
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| refuse(at, INVALID_TYPE, format!("'{at}' must be a list of strings")))?;
    if list.is_empty() {
        return Err(refuse(at, INVALID_VALUE, format!("'{at}' must not be empty")));
    }
    Ok(list)
}

fn to_json(v: &Value) -> String {
    serde_json::to_string(v).expect("a JSON value serializes")
}

/// A regex matching exactly one of `choices`: each escaped, alternated in a group (for engines whose
/// protocol has no choice constraint, SGLang's).
pub fn choice_regex(choices: &[String]) -> String {
    const SPECIAL: &str = r"\.^$*+?()[]{}|";
    let escaped: Vec<String> = choices
        .iter()
        .map(|c| {
            let mut out = String::with_capacity(c.len());
            for ch in c.chars() {
                if SPECIAL.contains(ch) {
                    out.push('\\');
                }
                out.push(ch);
            }
            out
        })
        .collect();
    format!("({})", escaped.join("|"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::openai::request::{parse_chat_request, parse_completion_request};

    fn chat(extra: Value) -> Result<Option<Constraint>, ApiError> {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        parse_chat_request(body.to_string().as_bytes()).map(|r| r.constraint)
    }

    fn schema_of(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn every_source_maps_to_its_constraint() {
        let person = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        let js = |c: Option<Constraint>| match c {
            Some(Constraint::JsonSchema(s)) => schema_of(&s),
            other => panic!("{other:?}"),
        };
        assert_eq!(chat(json!({"response_format": {"type": "text"}})).unwrap(), None);
        assert_eq!(
            js(chat(json!({"response_format": {"type": "json_object"}})).unwrap()),
            json!({"type": "object"})
        );
        let rf = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": true}});
        assert_eq!(js(chat(json!({"response_format": rf})).unwrap()), person);
        assert_eq!(
            js(chat(json!({"structured_outputs": {"json": person}})).unwrap()),
            person
        );
        assert_eq!(
            js(chat(json!({"structured_outputs": {"json": person.to_string()}})).unwrap()),
            person
        );
        assert_eq!(
            js(chat(json!({"structured_outputs": {"json_object": true}})).unwrap()),
            json!({"type": "object"})
        );
        assert_eq!(
            chat(json!({"structured_outputs": {"regex": "[a-z]+", "disable_fallback": false}})).unwrap(),
            Some(Constraint::Regex("[a-z]+".into()))
        );
        assert_eq!(
            chat(json!({"structured_outputs": {"choice": ["yes", "no"]}})).unwrap(),
            Some(Constraint::Choice(vec!["yes".into(), "no".into()]))
        );
        assert_eq!(
            chat(json!({"structured_outputs": {"grammar": "root ::= \"a\""}})).unwrap(),
            Some(Constraint::Grammar("root ::= \"a\"".into()))
        );
        assert_eq!(
            chat(json!({"structured_outputs": {"structural_tag": "{}"}})).unwrap(),
            Some(Constraint::StructuralTag("{}".into()))
        );
        assert_eq!(js(chat(json!({"guided_json": person})).unwrap()), person);
        assert_eq!(
            chat(json!({"guided_regex": "\\d+"})).unwrap(),
            Some(Constraint::Regex("\\d+".into()))
        );
        assert_eq!(
            chat(json!({"guided_choice": ["a"]})).unwrap(),
            Some(Constraint::Choice(vec!["a".into()]))
        );
        assert_eq!(
            chat(json!({"guided_grammar": "root ::= \"x\""})).unwrap(),
            Some(Constraint::Grammar("root ::= \"x\"".into()))
        );
        let tag = json!({"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}});
        match chat(json!({"response_format": tag})).unwrap() {
            Some(Constraint::StructuralTag(s)) => assert_eq!(schema_of(&s), tag),
            other => panic!("{other:?}"),
        }
        // Completions take the same constraints.
        let c = parse_completion_request(br#"{"model":"m","prompt":"x","guided_choice":["a","b"]}"#).unwrap();
        assert_eq!(c.constraint, Some(Constraint::Choice(vec!["a".into(), "b".into()])));
    }

    #[test]
    fn invalid_or_second_constraints_name_the_parameter_with_a_code() {
        let schema = json!({"type": "object"});
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let cases = [
            (json!({"response_format": "json"}), "response_format"),
            (json!({"response_format": {}}), "response_format.type"),
            (json!({"response_format": {"type": "xml"}}), "response_format.type"),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": schema}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": [1]}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema",
                                           "json_schema": {"name": "p", "schema": schema, "strict": "yes"}}}),
                "response_format.json_schema.strict",
            ),
            (
                json!({"response_format": {"type": "structural_tag"}}),
                "response_format",
            ),
            (json!({"structured_outputs": {}}), "structured_outputs"),
            (json!({"structured_outputs": "json"}), "structured_outputs"),
            (
                json!({"structured_outputs": {"json": schema, "regex": "a"}}),
                "structured_outputs.regex",
            ),
            (
                json!({"structured_outputs": {"choice": []}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"choice": [1]}}),
                "structured_outputs.choice",
            ),
            (json!({"structured_outputs": {"regex": ""}}), "structured_outputs.regex"),
            (
                json!({"structured_outputs": {"json": "{nope"}}),
                "structured_outputs.json",
            ),
            (
                json!({"structured_outputs": {"json": schema, "disable_any_whitespace": true}}),
                "structured_outputs.disable_any_whitespace",
            ),
            (json!({"guided_json": 5}), "guided_json"),
            (json!({"guided_choice": "a"}), "guided_choice"),
            (json!({"guided_grammar": ""}), "guided_grammar"),
            (json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
            (
                json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
                "guided_regex",
            ),
            (
                json!({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}),
                "structured_outputs.regex",
            ),
            (
                json!({"tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (
                json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "f"}},
                    "guided_json": schema}),
                "guided_json",
            ),
        ];
        for (extra, param) in cases {
            let e = chat(extra.clone()).unwrap_err();
            assert_eq!(
                (e.status, e.param.as_deref()),
                (400, Some(param)),
                "{extra}: {}",
                e.message
            );
            assert!(e.code.is_some(), "{extra}");
        }
        // `text` is no constraint: it combines with anything.
        assert!(chat(json!({"response_format": {"type": "text"}, "guided_regex": "a"})).is_ok());
        assert!(
            chat(json!({"tools": tools, "tool_choice": "auto", "response_format": {"type": "json_object"}})).is_ok()
        );
    }

    #[test]
    fn broken_regex_patterns_are_refused_and_other_dialects_pass() {
        for (body, param) in [
            (json!({"guided_regex": "(ab"}), "guided_regex"),
            (json!({"guided_regex": "ab)"}), "guided_regex"),
            (json!({"guided_regex": "[a-z"}), "guided_regex"),
            (json!({"guided_regex": "*a"}), "guided_regex"),
            (json!({"guided_regex": "a{2"}), "guided_regex"),
            (json!({"guided_regex": "[z-a]"}), "guided_regex"),
            (json!({"guided_regex": "a\\"}), "guided_regex"),
            (
                json!({"structured_outputs": {"regex": "((a)"}}),
                "structured_outputs.regex",
            ),
        ] {
            let e = chat(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert!(e.message.contains("not a valid regular expression"), "{}", e.message);
        }
        for ok in ["\\d{3}-\\d{4}", "(?=a)a", "(a)\\1", "[\\w.]+@[a-z]+\\.com", "(yes|no)"] {
            assert!(chat(json!({"guided_regex": ok})).is_ok(), "{ok}");
        }
    }

    #[test]
    fn choice_regex_escapes_every_metacharacter() {
        let choices = ["a.b", "(x|y)", "1+1=2?", "plain", "$[0]^{2}*\\"].map(String::from);
        assert_eq!(
            choice_regex(&choices),
            r"(a\.b|\(x\|y\)|1\+1=2\?|plain|\$\[0\]\^\{2\}\*\\)"
        );
    }
}
