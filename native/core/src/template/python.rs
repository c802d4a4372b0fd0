//! Python's spelling of values, so minijinja renders what jinja2 renders.
//!
//! jinja2 prints a value with `str()`: `True`, `None`, `['a', 1.0]`, `{'k': 'v'}`; minijinja would
//! print `true`, `none`, `["a", 1.0]`. HF's `tojson` is `json.dumps(..., ensure_ascii=False)`, whose
//! separators, float spelling (`1e-05`) and escapes differ from serde_json's.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

use crate::tokenize::{is_python_printable, is_python_space};

/// `str(value)`.
pub fn write_str(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(value, out),
    }
}

pub fn to_str(value: &Value) -> String {
    let mut out = String::new();
    write_str(value, &mut out);
    out
}

/// `type(value).__name__` for the JSON-like values templates handle.
pub fn type_name(value: &Value) -> &'static str {
    match value.kind() {
        ValueKind::Undefined => "Undefined",
        ValueKind::None => "NoneType",
        ValueKind::Bool => "bool",
        ValueKind::Number if value.is_integer() => "int",
        ValueKind::Number => "float",
        ValueKind::String => "str",
        ValueKind::Seq => "list",
        ValueKind::Map => "dict",
        _ => "object",
    }
}

/// `repr(value)` for the JSON-like values templates handle.
pub fn write_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(value, out),
        ValueKind::String => write_string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&key, out);
                    out.push_str(": ");
                    write_repr(&value.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

fn write_number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        out.push_str(&float_repr(f64::try_from(value.clone()).unwrap_or(f64::NAN)));
    }
}

/// `repr(float)`: shortest round-trip digits, positional for exponents -4..16, else `1e-05` style.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        let mut out = String::from(sign);
        if exp < 0 {
            out.push_str("0.");
            out.push_str(&"0".repeat((-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() > point {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            } else {
                out.push_str(&digits);
                out.push_str(&"0".repeat(point - digits.len()));
                out.push_str(".0");
            }
        }
        out
    } else {
        let mut out = String::from(sign);
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
        out
    }
}

/// `repr(str)`: single quotes unless the text has one and no double quote.
pub fn write_string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_ascii() || is_python_printable(c) => out.push(c),
            c if (c as u32) <= 0xff => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push(quote);
}

/// `str.strip(chars)` and friends: Python whitespace (`str.isspace`) when no characters are given.
pub fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let strip_it = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_python_space(c),
    };
    let s = if left { s.trim_start_matches(strip_it) } else { s };
    if right {
        s.trim_end_matches(strip_it)
    } else {
        s
    }
}

/// `str.split(sep=None, maxsplit=-1)`.
pub fn split(s: &str, sep: Option<&str>, maxsplit: Option<i64>) -> Result<Vec<String>, Error> {
    let limit = maxsplit.filter(|&n| n >= 0).map(|n| n as usize);
    match sep {
        Some("") => Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        Some(sep) => Ok(match limit {
            Some(n) => s.splitn(n + 1, sep).map(str::to_string).collect(),
            None => s.split(sep).map(str::to_string).collect(),
        }),
        None => {
            let mut parts = Vec::new();
            let mut rest = strip(s, None, true, false);
            while !rest.is_empty() {
                if limit.is_some_and(|n| parts.len() == n) {
                    parts.push(rest.to_string());
                    break;
                }
                let end = rest.find(is_python_space).unwrap_or(rest.len());
                parts.push(rest[..end].to_string());
                rest = strip(&rest[end..], None, true, false);
            }
            Ok(parts)
        }
    }
}

/// `str.rsplit(sep=None, maxsplit=-1)`.
pub fn rsplit(s: &str, sep: Option<&str>, maxsplit: Option<i64>) -> Result<Vec<String>, Error> {
    let limit = maxsplit.filter(|&n| n >= 0).map(|n| n as usize);
    let mut parts: Vec<String> = match (sep, limit) {
        (Some(""), _) => return Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        (Some(sep), Some(n)) => s.rsplitn(n + 1, sep).map(str::to_string).collect(),
        (Some(sep), None) => s.rsplit(sep).map(str::to_string).collect(),
        (None, _) => {
            let mut parts = Vec::new();
            let mut rest = strip(s, None, false, true);
            while !rest.is_empty() {
                if limit.is_some_and(|n| parts.len() == n) {
                    parts.push(rest.to_string());
                    break;
                }
                let start = rest
                    .rfind(is_python_space)
                    .map_or(0, |i| i + rest[i..].chars().next().map_or(1, char::len_utf8));
                parts.push(rest[start..].to_string());
                rest = strip(&rest[..start], None, false, true);
            }
            parts
        }
    };
    parts.reverse();
    Ok(parts)
}

/// jinja2's `wordcount`: the number of `\w+` runs.
pub fn word_count(s: &str) -> usize {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    s.split(|c: char| !word(c)).filter(|w| !w.is_empty()).count()
}

/// `str.islower()` / `str.isupper()`: some cased character, and none of the other case.
pub fn is_cased(s: &str, lower: bool) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_lowercase() || c.is_uppercase() {
            cased = true;
            if (lower && c.is_uppercase()) || (!lower && c.is_lowercase()) {
                return false;
            }
        }
    }
    cased
}

/// jinja2's `int(value, default=0, base=10)`: `int()`, else `int(float())`, else the default.
pub fn to_int(value: &Value, default: i64, base: u32) -> Value {
    match value.kind() {
        ValueKind::Bool => Value::from(i64::from(value.is_true())),
        ValueKind::Number if value.is_integer() => value.clone(),
        ValueKind::Number => {
            f64::try_from(value.clone()).map_or(Value::from(default), |f| Value::from(f.trunc() as i64))
        }
        ValueKind::String => {
            let text = strip(value.as_str().unwrap_or_default(), None, true, true).replace('_', "");
            i64::from_str_radix(&text, base)
                .map(Value::from)
                .or_else(|_| text.parse::<f64>().map(|f| Value::from(f.trunc() as i64)))
                .unwrap_or(Value::from(default))
        }
        _ => Value::from(default),
    }
}

/// jinja2's `float(value, default=0.0)`.
pub fn to_float(value: &Value, default: f64) -> f64 {
    match value.kind() {
        ValueKind::Bool => f64::from(u8::from(value.is_true())),
        ValueKind::Number => f64::try_from(value.clone()).unwrap_or(default),
        ValueKind::String => strip(value.as_str().unwrap_or_default(), None, true, true)
            .parse()
            .unwrap_or(default),
        _ => default,
    }
}

/// The arguments of `json.dumps` that HF's `tojson` passes through.
pub struct JsonOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(unit)`: one item per line, indented by `unit` per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl JsonOptions {
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Self {
        let (item_separator, key_separator) = separators.unwrap_or_else(|| {
            // json.dumps: ", " between items on one line, "," when indenting (the newline separates).
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        JsonOptions {
            ensure_ascii,
            indent,
            item_separator,
            key_separator,
            sort_keys,
        }
    }
}

fn type_error(what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: Object of type {what} is not JSON serializable"),
    )
}

/// `json.dumps(value, **options)`.
pub fn json_dumps(value: &Value, options: &JsonOptions, depth: usize, out: &mut String) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(unit) = &options.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(unit);
            }
        }
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number if value.is_integer() => {
            let _ = write!(out, "{value}");
        }
        ValueKind::Number => {
            let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
            out.push_str(&match f {
                f if f.is_nan() => "NaN".to_string(),
                f if f.is_infinite() && f > 0.0 => "Infinity".to_string(),
                f if f.is_infinite() => "-Infinity".to_string(),
                f => float_repr(f),
            });
        }
        ValueKind::String => write_json_string(value.as_str().unwrap_or_default(), options.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline(out, depth + 1);
                json_dumps(item, options, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline(out, depth + 1);
                write_json_string(key, options.ensure_ascii, out);
                out.push_str(&options.key_separator);
                json_dumps(item, options, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Undefined => return Err(type_error("Undefined")),
        other => return Err(type_error(&other.to_string())),
    }
    Ok(())
}

/// Dictionary keys as `json.dumps` converts them: strings stay, scalars become their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(key, &mut s);
            s
        }
        other => return Err(type_error(&format!("{other} as a key"))),
    })
}

/// A JSON string as Python's encoder writes it (lower-case hex, `\uXXXX` surrogate pairs).
pub fn write_json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelled_like_python() {
        for (f, python) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (123456789012345.6, "123456789012345.6"),
            (1e15, "1000000000000000.0"),
            (3.0e-7, "3e-07"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(f), python, "{f}");
        }
    }

    #[test]
    fn reprs_and_strs_are_pythons() {
        let value = Value::from_serialize(serde_json::json!({"a": [true, null, 1, 2.0, "it's"], "b": "x\ny"}));
        assert_eq!(to_str(&value), r#"{'a': [True, None, 1, 2.0, "it's"], 'b': 'x\ny'}"#);
        let mut s = String::new();
        write_string_repr("tab\t\u{7}é\u{200b}\u{1F600}'\"", &mut s);
        assert_eq!(s, "'tab\\t\\x07é\\u200b\u{1F600}\\'\"'");
    }

    #[test]
    fn split_and_strip_use_python_whitespace() {
        assert_eq!(split("  a b\u{1f}c  ", None, None).unwrap(), ["a", "b", "c"]);
        assert_eq!(split("a,b,,c", Some(","), Some(2)).unwrap(), ["a", "b", ",c"]);
        assert_eq!(split(" a  b c ", None, Some(1)).unwrap(), ["a", "b c "]);
        assert_eq!(strip("\u{1c} x \u{3000}", None, true, true), "x");
        assert_eq!(strip("xxhixx", Some("x"), true, false), "hixx");
        assert_eq!(rsplit(" a  b c ", None, Some(1)).unwrap(), [" a  b", "c"]);
        assert_eq!(rsplit("a,b,c", Some(","), Some(1)).unwrap(), ["a,b", "c"]);
        assert!(is_cased("hello world!", true) && !is_cased("Hello", true) && !is_cased("123", false));
    }
}
