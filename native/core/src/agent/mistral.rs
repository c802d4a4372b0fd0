//! Mistral `[TOOL_CALLS]` calls, both forms:
//! - a JSON array after the marker (tokenizers before v11, Mistral 7B v0.3, Nemo):
//!   `[TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "..."}, ...]`;
//! - name then arguments (v11+: Mistral Small 3.2, Devstral, Magistral), repeated per call:
//!   `[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}`, with an optional `[CALL_ID]id` before `[ARGS]`
//!   (and `[ARGS]` itself optional, as it disappears when special tokens are skipped).
//!
//! Text before the first marker is content; a marker followed by something that is not a call comes back
//! as content, exactly as written.
//!
//! Streaming: content as it arrives; the array form's calls when the array closes, the name form's each
//! when its arguments object closes.

use serde_json::Value;

use super::scan::{call_from_object, count_work, floor_boundary, json_object, scan, Content, Extent, Scan};
use super::{OutputParser, Parsed, ToolCallPiece};

const TAG: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
/// The longest name-and-id head accepted before its arguments: a marker followed by other text is held
/// back at most this long before it is known to be content.
const MAX_HEAD: usize = 512;

#[derive(PartialEq)]
enum State {
    Text,
    AfterTag,
    Array,
    Head,
    Args,
    Between,
}

pub struct Mistral {
    state: State,
    buf: String,
    /// The marker and head consumed for the call being read, given back as content if it is not one.
    raw: String,
    body: String,
    name: String,
    extent: Extent,
    content: Content,
    calls: u32,
}

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Mistral {
        state: State::Text,
        buf: String::new(),
        raw: String::new(),
        body: String::new(),
        name: String::new(),
        extent: Extent::default(),
        content: Content::default(),
        calls: 0,
    })
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || "_-.".contains(c)
}

/// The name in a head `name[CALL_ID]id[ARGS]` (both bracketed parts optional).
fn head_name(head: &str) -> Option<&str> {
    let end = head.find('[').unwrap_or(head.len());
    let name = head[..end].trim();
    if name.is_empty() || !name.chars().all(is_name_char) {
        return None;
    }
    let mut rest = head[end..].trim();
    if let Some(after) = rest.strip_prefix(CALL_ID) {
        let id_end = after.find('[').unwrap_or(after.len());
        rest = after[id_end..].trim();
    }
    let rest = rest.strip_prefix(ARGS).unwrap_or(rest);
    rest.trim().is_empty().then_some(name)
}

impl Mistral {
    fn not_a_call(&mut self, text: &str, out: &mut Parsed) {
        let raw = format!("{}{text}", std::mem::take(&mut self.raw));
        self.content.not_a_call(&raw, &mut out.content);
        self.state = State::Text;
    }

    fn emit(&mut self, name: String, arguments: String, out: &mut Parsed) {
        out.calls.push(ToolCallPiece {
            index: self.calls,
            id: None,
            name: Some(name),
            arguments,
        });
        self.calls += 1;
    }

    fn run(&mut self, out: &mut Parsed) {
        loop {
            match self.state {
                State::Text => match scan(&self.buf, &[TAG]) {
                    Scan::Found { at, .. } => {
                        self.content.text(&self.buf[..at], &mut out.content);
                        self.content.open_call();
                        self.raw = TAG.to_string();
                        self.buf.drain(..at + TAG.len());
                        self.state = State::AfterTag;
                    }
                    Scan::Text { safe } => {
                        self.content.text(&self.buf[..safe], &mut out.content);
                        self.buf.drain(..safe);
                        return;
                    }
                },
                State::AfterTag => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    let ws = self.buf.len() - t.len();
                    self.state = if t.starts_with('[') { State::Array } else { State::Head };
                    self.raw.push_str(&self.buf[..ws]);
                    self.buf.drain(..ws);
                    self.body.clear();
                    self.extent = Extent::default();
                }
                State::Array => {
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let Some(end) = self.extent.advance(&self.body) else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    match array_calls(&body[..end]) {
                        Some(calls) => {
                            for (name, arguments) in calls {
                                self.emit(name, arguments, out);
                            }
                            self.raw.clear();
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        None => self.not_a_call(&body[..end], out),
                    }
                }
                State::Head => {
                    // Decided only at the first `{` within MAX_HEAD bytes (or at MAX_HEAD), never earlier, so
                    // the outcome does not depend on how the text was split.
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let limit = floor_boundary(&self.body, MAX_HEAD);
                    count_work(limit);
                    let Some(p) = self.body[..limit].find('{') else {
                        if self.body.len() < MAX_HEAD {
                            return;
                        }
                        let body = std::mem::take(&mut self.body);
                        self.buf = body[limit..].to_string();
                        self.not_a_call(&body[..limit], out);
                        continue;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[p..].to_string();
                    match head_name(&body[..p]) {
                        Some(name) => {
                            self.name = name.to_string();
                            self.raw.push_str(&body[..p]);
                            self.extent = Extent::default();
                            self.state = State::Args;
                        }
                        None => self.not_a_call(&body[..p], out),
                    }
                }
                State::Args => {
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let Some(end) = self.extent.advance(&self.body) else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    match json_object(&body[..end]) {
                        Some(arguments) => {
                            let name = std::mem::take(&mut self.name);
                            self.emit(name, arguments, out);
                            self.raw.clear();
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        None => self.not_a_call(&body[..end], out),
                    }
                }
                State::Between => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(TAG) {
                        self.raw = TAG.to_string();
                        self.buf = rest.to_string();
                        self.state = State::AfterTag;
                    } else if t.is_empty() || TAG.starts_with(t) {
                        return;
                    } else {
                        self.state = State::Text;
                    }
                }
            }
        }
    }
}

/// The calls of the array form, if every element is a call and there is at least one.
fn array_calls(text: &str) -> Option<Vec<(String, String)>> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    let calls: Option<Vec<_>> = items.iter().map(|v| call_from_object(v.as_object()?)).collect();
    calls.filter(|c| !c.is_empty())
}

impl OutputParser for Mistral {
    fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        self.buf.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let rest = format!("{}{}", std::mem::take(&mut self.body), std::mem::take(&mut self.buf));
        match self.state {
            State::Text | State::Between => self.content.text(&rest, &mut out.content),
            _ => self.not_a_call(&rest, &mut out),
        }
        self.content.finish(&mut out.content);
        self.state = State::Text;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, long_plain_text_streams, parse_all_splits};
    use super::parser;

    // What Mistral-7B-Instruct-v0.3's chat template renders for an assistant message with two calls.
    const V03: &str = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdef123\"}, {\"name\": \"get_time\", \"arguments\": {}, \"id\": \"bcdef1234\"}]";
    // What Mistral-Small-3.2's (v11+) template renders: one marker per call, name then arguments.
    const V11: &str = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}";

    #[test]
    fn array_form_template_rendering() {
        let got = parse_all_splits(&parser, V03);
        assert_eq!(
            got,
            expect(
                "",
                "",
                &[call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
            )
        );
    }

    #[test]
    fn name_form_template_rendering() {
        let got = parse_all_splits(&parser, V11);
        assert_eq!(
            got,
            expect(
                "Sure.",
                "",
                &[call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
            )
        );
    }

    #[test]
    fn call_ids_skipped_special_tokens_and_text_after() {
        let text = "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"x\": \"{[\"}[TOOL_CALLS]g{\"y\": 2}\n\nDone.";
        let got = parse_all_splits(&parser, text);
        assert_eq!(
            got,
            expect("Done.", "", &[call("f", r#"{"x":"{["}"#), call("g", r#"{"y":2}"#)])
        );
    }

    #[test]
    fn not_calls_are_content() {
        for text in [
            "a [TOOL_CALLS] [1, 2]",
            "[TOOL_CALLS] hello world",
            "[TOOL_CALLS]f[ARGS]{\"x\": ",
            "[TOOL_CALLS]f[ARGS][1]",
            "[TOOL_CALLS]",
            "[TOOL_CALLS] a b [TOOL_CALLS]f{}",
            "x [TOOL_CA",
        ] {
            assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]), "{text}");
        }
        long_plain_text_streams(&parser);
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&parser, "", "");
        assert_linear(&parser, "[TOOL_CALLS]f[ARGS]{\"s\": \"", "\"}");
        assert_linear(
            &parser,
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"s\": \"",
            "\"}}]",
        );
    }
}
