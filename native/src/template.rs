//! Chat templates with Hugging Face semantics on minijinja.
//!
//! HF renders with `trim_blocks` and `lstrip_blocks`, exposes `raise_exception`, `strftime_now` and a
//! `tojson` that behaves like Python's `json.dumps(ensure_ascii=False)`; the same is set up here.

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template, shareable across threads.
pub struct ChatTemplate {
    env: Environment<'static>,
}

/// What went wrong while rendering: the template raised (the client's fault, a 400), or it failed.
#[derive(Debug, Clone, PartialEq)]
pub enum RenderError {
    Raised(String),
    Failed(String),
}

impl ChatTemplate {
    pub fn compile(source: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| format!("chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate { env })
    }

    /// Render with the given context (messages, add_generation_prompt, tools, bos_token, ...).
    pub fn render(&self, context: Value) -> Result<String, RenderError> {
        let template = self.env.get_template(TEMPLATE_NAME).expect("template was added");
        template.render(context).map_err(|e| {
            if e.kind() == ErrorKind::InvalidOperation {
                if let Some(detail) = e.detail() {
                    if let Some(msg) = detail.strip_prefix(RAISED_PREFIX) {
                        return RenderError::Raised(msg.to_string());
                    }
                }
            }
            RenderError::Failed(format!("{e:#}"))
        })
    }
}

const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED_PREFIX}{message}")))
}

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

/// `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`, Python's separators.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_python_json(
    value: &serde_json::Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
    out: &mut String,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    // Python uses ", " between items without indent and "," with it; ": " after keys in both.
    let item_sep = if indent.is_some() { "," } else { ", " };
    match value {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_json(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::to_string(key).expect("string serializes"));
                out.push_str(": ");
                write_python_json(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        J::Number(n) if n.is_f64() => {
            let f = n.as_f64().expect("f64");
            // Python prints integral floats with a trailing ".0".
            if f.fract() == 0.0 && f.abs() < 1e16 {
                out.push_str(&format!("{f:.1}"));
            } else {
                out.push_str(&n.to_string());
            }
        }
        other => out.push_str(&serde_json::to_string(other).expect("json serializes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn renders_with_trim_and_lstrip_blocks() {
        let t = ChatTemplate::compile(
            "{% for m in messages %}\n  [{{ m.role }}]{{ m.content | trim }}\n  {% endfor %}",
        )
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
        assert_eq!(t.render(context! {}), Err(RenderError::Raised("only user and assistant".into())));
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::compile("{{ x | tojson }}|{{ x | tojson(indent=2) }}").unwrap();
        let x: serde_json::Value =
            serde_json::from_str(r#"{"b": [1, 2.0, "é<>"], "a": {"k": null}, "e": []}"#).unwrap();
        let out = t.render(context! { x => Value::from_serialize(&x) }).unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.0, \"é<>\"], \"a\": {\"k\": null}, \"e\": []}|{\n  \"b\": [\n    1,\n    2.0,\n    \"é<>\"\n  ],\n  \"a\": {\n    \"k\": null\n  },\n  \"e\": []\n}"
        );
    }

    #[test]
    fn python_string_methods_work() {
        let t = ChatTemplate::compile("{% if s.strip().startswith('a') %}yes{% endif %}").unwrap();
        assert_eq!(t.render(context! { s => "  abc " }).unwrap(), "yes");
    }
}
