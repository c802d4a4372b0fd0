//! Tool calls from a forced `tool_choice`: the engine was constrained to JSON, an array of
//! `{"name": ..., "parameters": {...}}` objects for `required`, one such object for a named function
//! (which of the two is read from the output's first character).
//!
//! The JSON is scanned as it streams (strings, escapes and nesting tracked) and each call is returned
//! whole once its object closes: its name and its parameters re-serialized as the arguments string. Text
//! that does not make a call (malformed JSON, a cut-off object, anything outside the calls) comes back as
//! content at the end, never dropped.

use serde_json::Value;

use crate::agent::{OutputParser, Parsed, ToolCallPiece};

/// What the constraint made the engine write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForcedShape {
    /// `tool_choice: "required"`: a JSON array of calls.
    Array,
    /// A named function: one call object.
    Object,
}

#[derive(Default)]
pub struct ForcedCallsParser {
    /// Known from the first character that is not white space.
    shape: Option<ForcedShape>,
    text: String,
    /// How far `text` has been scanned, and the scanner's state there.
    scanned: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// Where the call object being read started.
    object_start: Option<usize>,
    /// The end of the last call returned: text before it is accounted for.
    consumed: usize,
    calls: u32,
    /// Text outside calls that is not the array's own punctuation: the output was not what the
    /// constraint promised.
    stray: bool,
}

impl ForcedCallsParser {
    pub fn new() -> Self {
        ForcedCallsParser::default()
    }

    /// The depth at which call objects open: inside the array, or at the top.
    fn call_depth(&self) -> u32 {
        match self.shape {
            Some(ForcedShape::Array) => 1,
            _ => 0,
        }
    }

    fn scan(&mut self) -> Parsed {
        let mut parsed = Parsed::default();
        let bytes = self.text.as_bytes();
        let mut at = self.scanned;
        while at < bytes.len() {
            let b = bytes[at];
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                at += 1;
                continue;
            }
            if self.shape.is_none() && !b.is_ascii_whitespace() {
                self.shape = Some(if b == b'[' {
                    ForcedShape::Array
                } else {
                    ForcedShape::Object
                });
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.object_start.is_none() {
                        self.stray = true;
                    }
                }
                b'{' | b'[' => {
                    if b == b'{' && self.depth == self.call_depth() && self.object_start.is_none() {
                        self.object_start = Some(at);
                    } else if self.object_start.is_none() && !(b == b'[' && self.depth == 0) {
                        self.stray = true;
                    }
                    self.depth += 1;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if b == b'}' && self.depth == self.call_depth() {
                        if let Some(start) = self.object_start.take() {
                            match call_of(&self.text[start..=at]) {
                                Some((name, arguments)) => {
                                    parsed.calls.push(ToolCallPiece {
                                        index: self.calls,
                                        id: None,
                                        name: Some(name),
                                        arguments,
                                    });
                                    self.calls += 1;
                                    self.consumed = at + 1;
                                }
                                None => self.stray = true,
                            }
                        }
                    }
                }
                b',' | b' ' | b'\n' | b'\r' | b'\t' => {}
                _ => {
                    if self.object_start.is_none() {
                        self.stray = true;
                    }
                }
            }
            at += 1;
        }
        self.scanned = at;
        parsed
    }
}

/// `{"name": "f", "parameters": {...}}` (or `"arguments"`) → the name and the arguments as a JSON string.
fn call_of(object: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(object).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("parameters").or_else(|| value.get("arguments")) {
        Some(args @ Value::Object(_)) => args.to_string(),
        Some(Value::String(s)) => s.clone(),
        None => "{}".to_string(),
        Some(_) => return None,
    };
    Some((name, arguments))
}

impl OutputParser for ForcedCallsParser {
    fn push(&mut self, text: &str) -> Parsed {
        self.text.push_str(text);
        self.scan()
    }

    fn finish(&mut self) -> Parsed {
        let mut parsed = self.scan();
        // Unclosed, malformed or stray text: whatever made no call is the answer's content (all of it when
        // no call was made, so nothing the model wrote is lost).
        let rest = &self.text[self.consumed..];
        let unfinished = self.object_start.is_some() || self.in_string;
        if self.calls == 0 {
            parsed.content = self.text.clone();
        } else if self.stray || unfinished {
            let trimmed = rest.trim_start_matches([',', ' ', '\n', '\r', '\t']);
            if !matches!(trimmed.trim(), "" | "]") {
                parsed.content = trimmed.to_string();
            }
        }
        parsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(pieces: &[&str]) -> (Vec<Parsed>, Parsed) {
        let mut p = ForcedCallsParser::new();
        let each = pieces.iter().map(|t| p.push(t)).collect();
        (each, p.finish())
    }

    fn calls(parts: &[Parsed]) -> Vec<(String, String)> {
        parts
            .iter()
            .flat_map(|p| p.calls.iter())
            .map(|c| (c.name.clone().unwrap(), c.arguments.clone()))
            .collect()
    }

    #[test]
    fn required_calls_come_out_as_each_object_closes_at_every_split() {
        let text = r#"[{"name": "get_weather", "parameters": {"city": "Par\"is", "n": [1, {"x": "}"}]}}, {"name": "now", "parameters": {}}]"#;
        for split in 0..=text.len() {
            if !text.is_char_boundary(split) {
                continue;
            }
            let (each, end) = run(&[&text[..split], &text[split..]]);
            let mut all = each.clone();
            all.push(end.clone());
            assert_eq!(
                calls(&all),
                vec![
                    ("get_weather".into(), r#"{"city":"Par\"is","n":[1,{"x":"}"}]}"#.into()),
                    ("now".into(), "{}".into())
                ],
                "split at {split}"
            );
            assert!(all.iter().all(|p| p.content.is_empty()), "split at {split}");
            let indexes: Vec<u32> = all.iter().flat_map(|p| p.calls.iter().map(|c| c.index)).collect();
            assert_eq!(indexes, [0, 1]);
        }
        // The first call is out as soon as its object closes, before the array does.
        let (each, _) = run(&[r#"[{"name": "a", "parameters": {}}"#, ", {"]);
        assert_eq!(calls(&each[..1]), [("a".to_string(), "{}".to_string())]);
    }

    #[test]
    fn a_named_call_is_one_object() {
        let (each, end) = run(&[r#"{"name": "f", "parame"#, r#"ters": {"q": 1}}"#]);
        let mut all = each;
        all.push(end);
        assert_eq!(calls(&all), [("f".to_string(), r#"{"q":1}"#.to_string())]);
    }

    #[test]
    fn malformed_or_truncated_output_comes_back_as_content() {
        let (_, end) = run(&[r#"[{"name": "f", "parameters": {"q"#]);
        assert_eq!(end.content, r#"[{"name": "f", "parameters": {"q"#);
        assert!(end.calls.is_empty());
        let (_, end) = run(&["not json at all"]);
        assert_eq!(end.content, "not json at all");
        // A call made, then a cut-off second: the first stays a call, the rest is content.
        let (each, end) = run(&[r#"[{"name": "a", "parameters": {}}, {"name": "b"#]);
        assert_eq!(calls(&each).len(), 1);
        assert_eq!(end.content, r#"{"name": "b"#);
    }
}
