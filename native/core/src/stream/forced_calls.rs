//! Tool calls from a forced `tool_choice`: the engine was constrained to JSON, an array of
//! `{"name": ..., "parameters": {...}}` objects for `required`, one such object for a named function
//! (which of the two is read from the output's first character).
//!
//! The JSON is scanned as it streams (strings, escapes and nesting tracked). A whole answer gets each call
//! once its object closes: its name, and its parameters' text with the whitespace outside strings removed
//! as the arguments string. A stream gets each call's name as soon as `{"name": "NAME", "parameters": {`
//! has arrived (the schema we build lists `name` first, and constrained engines write properties in that
//! order; an object written otherwise goes whole when it closes), then the parameters' text as it arrives:
//! fragments that concatenate to the whole answer's arguments. Text that does not make a call (malformed
//! JSON, a cut-off object, anything outside the calls) comes back as content at the end, never dropped,
//! except a call whose name was sent: it stays a call with the fragments sent, its text is not content.

use std::collections::HashSet;
use std::sync::Arc;

use crate::agent::json_call::{decode, CallReader, JsonCallReader};
use crate::agent::sent_call::{Calls, SentCall};
use crate::agent::{OutputParser, Parsed};

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
    calls: Calls,
    /// Streams: the reader of the call object being read (None once it is known not to stream).
    reader: Option<JsonCallReader>,
    /// Streams: the call object being read, once its name was sent.
    sent: Option<SentCall>,
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
                        self.reader = self.calls.streams().then(JsonCallReader::at_object);
                        self.sent = None;
                    } else if self.object_start.is_none() && !(b == b'[' && self.depth == 0) {
                        self.stray = true;
                    }
                    self.depth += 1;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if b == b'}' && self.depth == self.call_depth() {
                        if let Some(start) = self.object_start.take() {
                            let object = &self.text[start..=at];
                            read_call(&mut self.reader, &mut self.sent, &mut self.calls, object, &mut parsed);
                            match (self.sent.take(), decode(object)) {
                                // A sent call stays a call, malformed or not; its text is not content.
                                (Some(sent), decoded) => {
                                    sent.close(decoded, &mut parsed);
                                    self.consumed = at + 1;
                                }
                                (None, Some((name, arguments))) => {
                                    self.calls.whole(name, arguments, &mut parsed);
                                    self.consumed = at + 1;
                                }
                                (None, None) => self.stray = true,
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
        if let Some(start) = self.object_start {
            let object = &self.text[start..];
            read_call(&mut self.reader, &mut self.sent, &mut self.calls, object, &mut parsed);
        }
        parsed
    }
}

/// Streams: what the reader makes of the call object so far.
fn read_call(
    reader: &mut Option<JsonCallReader>,
    sent: &mut Option<SentCall>,
    calls: &mut Calls,
    object: &str,
    out: &mut Parsed,
) {
    let Some(r) = reader.as_mut() else { return };
    let mut args = String::new();
    match (r.read(object, &mut args), sent.as_mut()) {
        (Some(name), _) if calls.may_stream(&name) => *sent = Some(calls.start(name, args, out)),
        // Not a declared tool: the call goes whole when it closes.
        (Some(_), _) => *reader = None,
        (None, Some(call)) => call.more(&args, out),
        (None, None) => {}
    }
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
        // A sent call the output ends inside stays as sent: its text is not content.
        let end = match (self.sent.take(), self.object_start) {
            (Some(_), Some(start)) => start,
            _ => self.text.len(),
        };
        let rest = &self.text[self.consumed..end];
        let unfinished = (self.object_start.is_some() && end == self.text.len()) || self.in_string;
        if self.calls.count == 0 {
            parsed.content = self.text.clone();
        } else if self.stray || unfinished {
            let trimmed = rest.trim_start_matches([',', ' ', '\n', '\r', '\t']);
            if !matches!(trimmed.trim(), "" | "]") {
                parsed.content = trimmed.to_string();
            }
        }
        parsed
    }

    fn stream_calls(&mut self, declared: Option<Arc<HashSet<String>>>) {
        self.calls.stream(declared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::testutil::{
        call, call_pieces, declaring, expect, parse_all_splits, piece, run as run_merged, streaming,
    };

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

    fn forced() -> Box<dyn OutputParser> {
        Box::new(ForcedCallsParser::new())
    }

    #[test]
    fn streamed_equals_whole_at_every_split_point() {
        let required = r#"[{"name": "get_weather", "parameters": {"city": "Par\"is", "n": [1, {"x": "}"}], "f": 1.50}}, {"name": "now", "parameters": {}}]"#;
        let got = parse_all_splits(&forced, required);
        let weather = r#"{"city":"Par\"is","n":[1,{"x":"}"}],"f":1.50}"#;
        assert_eq!(
            got,
            expect(
                "",
                "",
                &[("get_weather".into(), weather.into()), ("now".into(), "{}".into())]
            )
        );
        let named = "{\n  \"name\": \"f\",\n  \"parameters\": {\"q\": [1, 2]}\n}";
        assert_eq!(
            parse_all_splits(&forced, named),
            expect("", "", &[call("f", r#"{"q":[1,2]}"#)])
        );
    }

    #[test]
    fn a_stream_sends_each_name_then_the_parameters_as_they_arrive() {
        let parts = [
            r#"[{"name": "get_weather", "parameters": {"ci"#,
            r#"ty": "Paris"}}, {"name": "n"#,
            r#"ow", "parameters": {}}]"#,
        ];
        let got = call_pieces(declaring(&forced, &["get_weather", "now"]).as_mut(), &parts);
        assert_eq!(
            got,
            [
                vec![piece(0, Some("get_weather"), r#"{"ci"#)],
                vec![piece(0, None, r#"ty":"Paris"}"#)],
                vec![piece(1, Some("now"), "{}")],
                vec![]
            ]
        );
        // Parameters written before the name: the call goes whole when its object closes.
        let late = [r#"{"parameters": {"q": 1}, "na"#, r#"me": "f"}"#];
        let got = call_pieces(streaming(&forced).as_mut(), &late);
        assert_eq!(got, [vec![], vec![piece(0, Some("f"), r#"{"q":1}"#)], vec![]]);
    }

    #[test]
    fn a_cut_off_call_whose_name_was_sent_stays_a_call() {
        let cut = r#"[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"q": "x"#;
        let got = run_merged(streaming(&forced).as_mut(), &[cut]);
        assert_eq!(
            got,
            expect("", "", &[call("a", "{}"), ("b".into(), r#"{"q":"x"#.into())])
        );
        // Whole: the cut-off call is content.
        let got = run_merged(forced().as_mut(), &[cut]);
        assert_eq!(
            got,
            expect(r#"{"name": "b", "parameters": {"q": "x"#, "", &[call("a", "{}")])
        );
    }
}
