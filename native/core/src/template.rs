//! Chat templates with Hugging Face semantics on minijinja, rendering byte-identical to
//! `transformers`' `apply_chat_template` (jinja2).
//!
//! HF renders with `trim_blocks` and `lstrip_blocks`, exposes `raise_exception`, `strftime_now`,
//! `namespace()` and `dict()`, and a `tojson` that is Python's `json.dumps(ensure_ascii=False)`; the
//! same is set up here. Where minijinja and jinja2 disagree, jinja2's behaviour is restored: values
//! print as Python prints them (`True`, `None`, `['a']`), `string`, `join` and `trim` use Python's
//! `str()` and whitespace, `is sequence` and `is number` follow Python's types, `is iterable` is false
//! for none and `length` of undefined is 0, string methods (`strip`, `split`, `join`, ...) are
//! Python's, and `{% generation %}` blocks render their body.
//! Known remaining differences: tuples (from `.items()`, `dictsort`) print as lists, strings inside
//! a list or dict joined with `~` keep double quotes, the `%` string-formatting operator is
//! refused (the `format` filter works), `+` with a `| safe` operand does not HTML-escape the other one
//! (jinja2's Markup arithmetic does; `~` agrees), and looping over none renders nothing (jinja2 raises).

mod hf;
mod python;
mod tool_calls;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

pub use hf::ChatInputs;

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template, shareable across threads.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

/// What went wrong while rendering: the template raised or the input was refused (the client's
/// fault, a 400), a request field could not be given to the template (a 400 naming `param`), or
/// rendering failed.
#[derive(Debug, Clone, PartialEq)]
pub enum RenderError {
    Raised(String),
    Invalid { param: String, message: String },
    Failed(String),
}

impl ChatTemplate {
    pub fn compile(source: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(python_method);
        env.set_formatter(|out, _state, value| {
            match value.as_str() {
                Some(s) => out.write_str(s)?,
                None => out.write_str(&python::to_str(value))?,
            }
            Ok(())
        });
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("string", |value: &Value| python::to_str(value));
        env.add_filter("join", join);
        env.add_filter("trim", trim);
        env.add_filter("replace", replace);
        env.add_filter("int", int);
        env.add_filter("float", float);
        env.add_filter("wordcount", |value: &Value| python::word_count(&python::to_str(value)));
        // jinja2's `sequence` is "has a length and items": strings and dicts too.
        env.add_test("sequence", |value: &Value| {
            matches!(value.kind(), ValueKind::Seq | ValueKind::String | ValueKind::Map)
        });
        // jinja2: none is not iterable (`tools is iterable and tools | length > 0` on a plain chat),
        // undefined is (an empty sequence).
        env.add_test("iterable", |value: &Value| !value.is_none() && value.try_iter().is_ok());
        // jinja2: the length of undefined is 0; none, numbers and booleans have none.
        env.add_filter("length", length);
        env.add_filter("count", length);
        // Python's bool is a number.
        env.add_test("number", |value: &Value| {
            matches!(value.kind(), ValueKind::Number | ValueKind::Bool)
        });
        env.add_template_owned(TEMPLATE_NAME, without_generation_tags(source))
            .map_err(|e| format!("chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render with the given context (messages, add_generation_prompt, tools, bos_token, ...).
    pub fn render(&self, context: Value) -> Result<String, RenderError> {
        let template = self.env.get_template(TEMPLATE_NAME).expect("template was added");
        // minijinja 2.24 panics on some inputs (a reversed slice of an empty list, `[][::-1]`, as Qwen3's
        // `messages[::-1]` would be over an empty list): a template failure, not a crashed request thread.
        let rendered =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| template.render(context))).map_err(|panic| {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("unknown");
                RenderError::Failed(format!("the template engine failed: {why}"))
            })?;
        rendered.map_err(|e| {
            if e.kind() == ErrorKind::InvalidOperation {
                if let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX)) {
                    return RenderError::Raised(msg.to_string());
                }
            }
            RenderError::Failed(format!("{e:#}"))
        })
    }

    /// Render with a JSON object as the whole context (no Hugging Face preprocessing).
    pub fn render_json(&self, context: &serde_json::Value) -> Result<String, RenderError> {
        self.render(Value::from_serialize(context))
    }
}

/// `{% generation %}` / `{% endgeneration %}` (HF's assistant-mask tags) become an always-true
/// `if`, keeping their whitespace control, so the body renders as jinja2 renders it.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            rest = tag;
            break;
        };
        let inner = &tag[2..close];
        let control = |c: Option<char>| c.filter(|c| matches!(c, '-' | '+'));
        let lead = control(inner.chars().next());
        let inner = if lead.is_some() { &inner[1..] } else { inner };
        let trail = control(inner.chars().last());
        let inner = if trail.is_some() {
            &inner[..inner.len() - 1]
        } else {
            inner
        };
        let (lead, trail) = (
            lead.map(String::from).unwrap_or_default(),
            trail.map(String::from).unwrap_or_default(),
        );
        match inner.trim() {
            "generation" => out.push_str(&format!("{{%{lead} if true {trail}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{lead} endif {trail}%}}")),
            _ => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(message: Value) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{}", python::to_str(&message)),
    ))
}

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let arg = |i: usize, name: &str| param(&args, &kwargs, i, name);
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = arg(1, "indent")?.map(|v| match v.as_str() {
        Some(unit) => unit.to_string(),
        None => " ".repeat(v.as_i64().unwrap_or(0).max(0) as usize),
    });
    let separators = match arg(2, "separators")? {
        Some(seps) => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] => Some((python::to_str(item), python::to_str(key))),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair",
                    ))
                }
            }
        }
        None => None,
    };
    let sort_keys = arg(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let options = python::JsonOptions::new(ensure_ascii, indent, separators, sort_keys);
    let mut out = String::new();
    python::json_dumps(value, &options, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// A filter argument given by position or by name (Python's calling convention); none counts as
/// not given.
fn param(args: &[Value], kwargs: &Kwargs, index: usize, name: &str) -> Result<Option<Value>, Error> {
    let named: Option<Value> = kwargs.get(name)?;
    Ok(named
        .or_else(|| args.get(index).cloned())
        .filter(|v| !v.is_none() && !v.is_undefined()))
}

/// jinja2's `length` (`len()`), for which undefined is empty.
fn length(value: &Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    value.len().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("object of type '{}' has no len()", python::type_name(value)),
        )
    })
}

/// jinja2's `join(value, d='', attribute=None)`: `str()` of each item.
fn join(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let separator = param(&args, &kwargs, 0, "d")?
        .map(|v| python::to_str(&v))
        .unwrap_or_default();
    let attribute = param(&args, &kwargs, 1, "attribute")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(&separator);
        }
        let item = match &attribute {
            Some(path) => lookup(&item, path)?,
            None => item,
        };
        python::write_str(&item, &mut out);
    }
    Ok(out)
}

/// jinja2's attribute path: `a.b` or an integer index.
fn lookup(item: &Value, path: &Value) -> Result<Value, Error> {
    let Some(path) = path.as_str() else {
        return item.get_item(path);
    };
    let mut current = item.clone();
    for part in path.split('.') {
        current = match part.parse::<i64>() {
            Ok(index) => current.get_item(&Value::from(index))?,
            Err(_) => current.get_attr(part)?,
        };
    }
    Ok(current)
}

/// jinja2's `trim(value, chars=None)`: Python's `str.strip`.
fn trim(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let chars = param(&args, &kwargs, 0, "chars")?.map(|v| python::to_str(&v));
    kwargs.assert_all_used()?;
    Ok(python::strip(&python::to_str(value), chars.as_deref(), true, true).to_string())
}

/// jinja2's `replace(s, old, new, count=None)`.
fn replace(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let text = |i, name| -> Result<String, Error> {
        let v = param(&args, &kwargs, i, name)?.ok_or_else(|| Error::new(ErrorKind::MissingArgument, name))?;
        Ok(python::to_str(&v))
    };
    let (old, new) = (text(0, "old")?, text(1, "new")?);
    let count = param(&args, &kwargs, 2, "count")?
        .and_then(|v| v.as_i64())
        .filter(|&n| n >= 0);
    kwargs.assert_all_used()?;
    let s = python::to_str(value);
    Ok(match count {
        Some(n) => s.replacen(&old, &new, n as usize),
        None => s.replace(&old, &new),
    })
}

/// jinja2's `int(value, default=0, base=10)`.
fn int(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let default = param(&args, &kwargs, 0, "default")?
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let base = param(&args, &kwargs, 1, "base")?.and_then(|v| v.as_i64()).unwrap_or(10);
    kwargs.assert_all_used()?;
    Ok(python::to_int(value, default, base.clamp(2, 36) as u32))
}

/// jinja2's `float(value, default=0.0)`.
fn float(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<f64, Error> {
    let default = param(&args, &kwargs, 0, "default")?.map_or(0.0, |v| python::to_float(&v, 0.0));
    kwargs.assert_all_used()?;
    Ok(python::to_float(value, default))
}

/// Python string methods minijinja-contrib spells differently; everything else goes to pycompat.
fn python_method(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "strip" | "lstrip" | "rstrip" => {
                let (chars,): (Option<&str>,) = from_args(args)?;
                let (left, right) = (method != "rstrip", method != "lstrip");
                return Ok(Value::from(python::strip(s, chars, left, right)));
            }
            "split" | "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                let parts = if method == "split" {
                    python::split(s, sep, maxsplit)
                } else {
                    python::rsplit(s, sep, maxsplit)
                };
                return Ok(Value::from(parts?));
            }
            "islower" | "isupper" => {
                let () = from_args(args)?;
                return Ok(Value::from(python::is_cased(s, method == "islower")));
            }
            "join" => {
                let (items,): (&Value,) = from_args(args)?;
                let mut out = String::new();
                for (i, item) in items.try_iter()?.enumerate() {
                    let text = item.as_str().ok_or_else(|| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            format!("sequence item {i}: expected str instance"),
                        )
                    })?;
                    if i > 0 {
                        out.push_str(s);
                    }
                    out.push_str(text);
                }
                return Ok(Value::from(out));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    fn render(source: &str, ctx: serde_json::Value) -> String {
        ChatTemplate::compile(source)
            .unwrap()
            .render(Value::from_serialize(&ctx))
            .unwrap()
    }

    #[test]
    fn renders_with_trim_and_lstrip_blocks() {
        let t =
            ChatTemplate::compile("{% for m in messages %}\n  [{{ m.role }}]{{ m.content | trim }}\n  {% endfor %}")
                .unwrap();
        let out = t
            .render(context! { messages => vec![context!{role => "user", content => " hi "}] })
            .unwrap();
        // What jinja2 (trim_blocks, lstrip_blocks) renders for the same template.
        assert_eq!(out, "  [user]hi\n");
    }

    #[test]
    fn raise_exception_is_reported_as_raised() {
        let t = ChatTemplate::compile("{{ raise_exception('only user and assistant') }}").unwrap();
        assert_eq!(
            t.render(context! {}),
            Err(RenderError::Raised("only user and assistant".into()))
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let x = serde_json::json!({"x": {"b": [1, 2.0, "é<>", 1e-5], "a": {"k": null}, "e": []}});
        assert_eq!(
            render("{{ x | tojson }}|{{ x | tojson(indent=2) }}", x.clone()),
            "{\"b\": [1, 2.0, \"é<>\", 1e-05], \"a\": {\"k\": null}, \"e\": []}|{\n  \"b\": [\n    1,\n    2.0,\n    \
             \"é<>\",\n    1e-05\n  ],\n  \"a\": {\n    \"k\": null\n  },\n  \"e\": []\n}"
        );
        assert_eq!(
            render("{{ x.b | tojson(ensure_ascii=true, separators=(',', ':')) }}", x),
            "[1,2.0,\"\\u00e9<>\",1e-05]"
        );
    }

    #[test]
    fn values_print_as_python_prints_them() {
        let ctx = serde_json::json!({"t": true, "n": null, "l": ["a", 1, false], "d": {"k": "v"}});
        assert_eq!(
            render("{{ t }} {{ n }} {{ l }} {{ d }} {{ l|join(',') }} {{ t|string }}", ctx),
            "True None ['a', 1, False] {'k': 'v'} a,1,False True"
        );
    }

    #[test]
    fn python_string_methods_work() {
        let ctx = serde_json::json!({"s": "  abc def \u{1f}"});
        assert_eq!(
            render("{% if s.strip().startswith('a') %}yes{% endif %}", ctx.clone()),
            "yes"
        );
        assert_eq!(
            render("{{ s.split() }}|{{ '-'.join(s.split()) }}|{{ s|trim }}", ctx),
            "['abc', 'def']|abc-def|abc def"
        );
    }

    fn apply(
        source: &str,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, RenderError> {
        let messages = messages.as_array().unwrap();
        ChatTemplate::compile(source).unwrap().apply(&ChatInputs {
            messages,
            tools,
            ..Default::default()
        })
    }

    #[test]
    fn absent_tools_behave_as_jinja2_none() {
        let user = serde_json::json!([{"role": "user", "content": "hi"}]);
        // Each expression with what jinja2 renders for `tools=None` (transformers without tools).
        for (expr, jinja2) in [
            ("tools is defined", "True"),
            ("tools is none", "True"),
            ("tools is not none", "False"),
            ("tools is iterable", "False"),
            ("tools is iterable and tools | length > 0", "False"),
            ("'yes' if tools else 'no'", "no"),
            ("documents is iterable", "False"),
            ("undefined_name is iterable", "True"),
            ("undefined_name | length", "0"),
            ("(tools or []) | length", "0"),
            ("messages is iterable", "True"),
            ("messages[0] is iterable", "True"),
            ("'abc' is iterable", "True"),
            ("1 is iterable", "False"),
        ] {
            assert_eq!(
                apply(&format!("{{{{ {expr} }}}}"), &user, None).unwrap(),
                jinja2,
                "{expr}"
            );
        }
        // jinja2 raises TypeError for these.
        for expr in ["tools | length", "tools | count", "1 | length"] {
            let Err(RenderError::Failed(e)) = apply(&format!("{{{{ {expr} }}}}"), &user, None) else {
                panic!("{expr} should fail")
            };
            assert!(e.contains("has no len()"), "{e}");
        }
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let guarded =
            "{% if tools is iterable and tools | length > 0 %}{{ tools | length }} tools{% else %}plain{% endif %}";
        assert_eq!(apply(guarded, &user, None).unwrap(), "plain");
        assert_eq!(apply(guarded, &user, Some(&tools)).unwrap(), "1 tools");
        assert_eq!(apply(guarded, &user, Some(&serde_json::json!([]))).unwrap(), "plain");
    }

    #[test]
    fn tool_call_arguments_are_parsed_before_rendering() {
        let chat = serde_json::json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "b", "type": "function", "function": {"name": "w", "arguments": {"city": "東京"}}},
            ]},
        ]);
        let source = "{% for m in messages %}{% for c in m.tool_calls | default([]) %}\
                      {{ c.function.arguments | tojson }}|{{ c.function.arguments.city }}\n{% endfor %}{% endfor %}";
        assert_eq!(
            apply(source, &chat, None).unwrap(),
            "{\"city\": \"Paris\"}|Paris\n{\"city\": \"東京\"}|東京\n"
        );
        let mut bad = chat.clone();
        bad[1]["tool_calls"][1]["function"]["arguments"] = serde_json::json!("{city: Paris}");
        let Err(RenderError::Invalid { param, .. }) = apply(source, &bad, None) else {
            panic!("invalid arguments are refused")
        };
        assert_eq!(param, "messages[1].tool_calls[1].function.arguments");
    }

    #[test]
    fn an_engine_panic_is_a_render_failure() {
        let t = ChatTemplate::compile("{{ items[::-1] }}").unwrap();
        assert_eq!(
            t.render(Value::from_serialize(serde_json::json!({"items": [1, 2]}))),
            Ok("[2, 1]".into())
        );
        let Err(RenderError::Failed(e)) = t.render(Value::from_serialize(serde_json::json!({"items": []}))) else {
            panic!("refused, not panicked")
        };
        assert!(e.contains("template engine failed"), "{e}");
    }

    #[test]
    fn generation_tags_render_their_body() {
        assert_eq!(
            render("a{%- generation -%}  b  {%- endgeneration %}c", serde_json::json!({})),
            "abc"
        );
        assert_eq!(
            render("{% generation %}\nx\n{% endgeneration %}\n", serde_json::json!({})),
            "x\n"
        );
    }
}
