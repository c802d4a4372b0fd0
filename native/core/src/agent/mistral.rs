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
//! Arguments are the model's JSON object text with the whitespace outside strings removed (in the array
//! form, arguments given as a JSON string holding an object, or written before the name, are re-serialized
//! compactly).
//!
//! Streaming: content as it arrives. A whole answer gets the array form's calls when the array closes
//! (all of them calls, else the array is content), the name form's each when its arguments object closes.
//! A stream gets a call's name as soon as it is certain and declared, then its arguments' text as it
//! arrives: the name form's at its arguments' `{`; in the array form each element's at
//! `{"name": "NAME", "arguments": {` (name first; an element written otherwise, or a call to an undeclared
//! tool, goes whole when it closes, or when the array closes if no call of the array was sent yet). Once a
//! call of an array was sent the array counts as calls: an element after it that is not a call ends the
//! calls there, and the rest of the array is dropped as markup.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use super::json_call::{decode, Elements, JsonCallReader};
use super::scan::{count_work, floor_boundary, minified_object, scan, Content, Extent, MinifiedObject, Scan};
use super::sent_call::{Calls, SentCall};
use super::tagged::CallReader;
use super::{OutputParser, Parsed};

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
    calls: Calls,
    /// Streams, name form: the arguments being copied, when the name may stream.
    object: Option<MinifiedObject>,
    /// Streams: the call being read, once its name was sent.
    sent: Option<SentCall>,
    /// Streams, array form: the array being read.
    array: ArrayStream,
}

/// The array form in a stream: its elements as they arrive.
#[derive(Default)]
struct ArrayStream {
    elements: Elements,
    /// The element being read (its start) and its reader (None once it is known not to stream).
    reading: Option<(usize, Option<JsonCallReader>)>,
    /// Calls that closed before any was sent, held for when the array closes (or a call is sent).
    held: Vec<(String, String)>,
    /// Elements announced (the array's first `done` elements).
    done: usize,
    /// A call of this array was sent: the array counts as calls.
    committed: bool,
    /// An element was not a call: nothing more streams (the array is content, or ends its calls there).
    failed: bool,
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
        calls: Calls::default(),
        object: None,
        sent: None,
        array: ArrayStream::default(),
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

    /// Streams, array form: reads the array's text so far (up to its end, once known).
    fn read_array(&mut self, end: Option<usize>, out: &mut Parsed) {
        let text = &self.body[..end.unwrap_or(self.body.len())];
        let a = &mut self.array;
        loop {
            let closed = a.elements.next_closed(text);
            a.failed |= a.elements.stray;
            let Some((start, upto)) = closed.or_else(|| a.elements.open().map(|s| (s, text.len()))) else {
                return;
            };
            if a.reading.as_ref().map(|(s, _)| *s) != Some(start) {
                a.reading = Some((start, Some(JsonCallReader::at_object())));
                self.sent = None;
            }
            if let Some((_, Some(reader))) = a.reading.as_mut().filter(|_| !a.failed) {
                let mut args = String::new();
                match (reader.read(&text[start..upto], &mut args), self.sent.as_mut()) {
                    (Some(name), _) if self.calls.may_stream(&name) => {
                        // The first call sent commits the array: the calls held before it go first.
                        for (name, arguments) in a.held.drain(..) {
                            self.calls.whole(name, arguments, out);
                            a.done += 1;
                        }
                        a.committed = true;
                        self.sent = Some(self.calls.start(name, args, out));
                    }
                    (Some(_), _) => a.reading = Some((start, None)),
                    (None, Some(sent)) => sent.more(&args, out),
                    (None, None) => {}
                }
            }
            let Some((start, end)) = closed else { return };
            let decoded = decode(&text[start..end]);
            match (self.sent.take(), decoded) {
                (Some(sent), decoded) => {
                    a.failed |= decoded.is_none();
                    sent.close(decoded, out);
                    a.done += 1;
                }
                (None, Some((name, arguments))) if a.committed && !a.failed => {
                    self.calls.whole(name, arguments, out);
                    a.done += 1;
                }
                (None, Some(call)) => a.held.push(call),
                (None, None) => a.failed = true,
            }
        }
    }

    /// Streams, name form: the arguments' text so far (up to their end, once known).
    fn read_args(&mut self, end: Option<usize>, out: &mut Parsed) {
        let Some(object) = self.object.as_mut() else { return };
        let mut args = String::new();
        object.feed(&self.body[..end.unwrap_or(self.body.len())], &mut args);
        match self.sent.as_mut() {
            Some(sent) => sent.more(&args, out),
            None => self.sent = Some(self.calls.start(self.name.clone(), args, out)),
        }
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
                    self.array = ArrayStream::default();
                    self.sent = None;
                }
                State::Array => {
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let end = self.extent.advance(&self.body);
                    if self.calls.streams() {
                        self.read_array(end, out);
                    }
                    let Some(end) = end else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    match array_calls(&body[..end]) {
                        Some(calls) => {
                            for (name, arguments) in calls.into_iter().skip(self.array.done) {
                                self.calls.whole(name, arguments, out);
                            }
                            self.raw.clear();
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        // Calls of it were sent: they stay, the rest is markup.
                        None if self.array.committed => {
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
                            self.object = self.calls.may_stream(name).then(MinifiedObject::default);
                            self.sent = None;
                            self.state = State::Args;
                        }
                        None => self.not_a_call(&body[..p], out),
                    }
                }
                State::Args => {
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let end = self.extent.advance(&self.body);
                    self.read_args(end, out);
                    let Some(end) = end else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    let name = std::mem::take(&mut self.name);
                    let decoded = minified_object(&body[..end]).map(|arguments| (name, arguments));
                    match (self.sent.take(), decoded) {
                        (Some(sent), decoded) => {
                            // A sent call stays a call, malformed or not; its markup is not content.
                            sent.close(decoded, out);
                            self.raw.clear();
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        (None, Some((name, arguments))) => {
                            self.calls.whole(name, arguments, out);
                            self.raw.clear();
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        (None, None) => self.not_a_call(&body[..end], out),
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

/// The calls of the array form, if every element is a call and there is at least one (each element's
/// arguments as `json_call::decode` reads them, as a stream does).
fn array_calls(text: &str) -> Option<Vec<(String, String)>> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    let mut elements = Elements::default();
    let mut calls = Vec::new();
    while let Some((start, end)) = elements.next_closed(text) {
        calls.push(decode(&text[start..end])?);
    }
    (!calls.is_empty() && calls.len() == items.len() && !elements.stray).then_some(calls)
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
        let sent = self.sent.take().is_some() || (self.state == State::Array && self.array.committed);
        match self.state {
            State::Text | State::Between => self.content.text(&rest, &mut out.content),
            // A call sent (or an array with calls sent) the output ends inside stays as sent.
            State::Args | State::Array if sent => {
                self.raw.clear();
                self.content.call_boundary();
            }
            _ => self.not_a_call(&rest, &mut out),
        }
        self.content.finish(&mut out.content);
        self.state = State::Text;
        out
    }

    fn stream_calls(&mut self, declared: Option<Arc<HashSet<String>>>) {
        self.calls.stream(declared);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{
        assert_linear, call, call_pieces, declaring, expect, long_plain_text_streams, parse_all_splits,
        parse_whole_splits, piece, run, streaming,
    };
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
            "[TOOL_CALLS]f[ARGS][1]",
            "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": [1]}]",
            "[TOOL_CALLS]",
            "[TOOL_CALLS] a b [TOOL_CALLS]f{}",
            "x [TOOL_CA",
        ] {
            assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]), "{text}");
        }
        long_plain_text_streams(&parser);
    }
    #[test]
    fn a_stream_sends_names_then_arguments_in_both_forms() {
        let at = V11.find("Pa").unwrap();
        let got = call_pieces(streaming(&parser).as_mut(), &[&V11[..at], &V11[at..]]);
        assert_eq!(
            got,
            [
                vec![piece(0, Some("get_weather"), "{\"city\":\"")],
                vec![piece(0, None, "Paris\"}"), piece(1, Some("get_time"), "{}")],
                vec![]
            ]
        );
        let at = V03.find("Pa").unwrap();
        let got = call_pieces(streaming(&parser).as_mut(), &[&V03[..at], &V03[at..]]);
        assert_eq!(
            got,
            [
                vec![piece(0, Some("get_weather"), "{\"city\":\"")],
                vec![piece(0, None, "Paris\"}"), piece(1, Some("get_time"), "{}")],
                vec![]
            ]
        );
    }

    #[test]
    fn array_calls_before_the_first_streamed_one_are_held_then_go_first() {
        // get_weather is not declared: held until get_time (declared) streams, then sent whole before it.
        let at = V03.find("\"get_time\", \"arguments\": {").unwrap() + 26;
        let got = call_pieces(declaring(&parser, &["get_time"]).as_mut(), &[&V03[..at], &V03[at..]]);
        assert_eq!(
            got,
            [
                vec![
                    piece(0, Some("get_weather"), r#"{"city":"Paris"}"#),
                    piece(1, Some("get_time"), "{")
                ],
                vec![piece(1, None, "}")],
                vec![]
            ]
        );
        // None declared: all whole when the array closes.
        let got = call_pieces(declaring(&parser, &[]).as_mut(), &[&V03[..at], &V03[at..]]);
        assert_eq!(got[0], vec![]);
        assert_eq!(got[1].len(), 2);
    }

    #[test]
    fn truncated_and_malformed_calls_after_the_name_was_streamed_stay_calls() {
        let cut = "ok [TOOL_CALLS]f[ARGS]{\"x\": ";
        assert_eq!(parse_whole_splits(&parser, cut), expect(cut, "", &[]));
        let got = run(streaming(&parser).as_mut(), &[cut]);
        assert_eq!(got, expect("ok", "", &[("f".into(), "{\"x\":".into())]));
        // An array whose first call streamed, then an element that is not a call: the calls stop there.
        let junk = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, 7] after";
        assert_eq!(parse_whole_splits(&parser, junk), expect(junk, "", &[]));
        let got = run(streaming(&parser).as_mut(), &[junk]);
        assert_eq!(got, expect("after", "", &[call("f", r#"{"a":1}"#)]));
        let cut_array = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g";
        assert_eq!(parse_whole_splits(&parser, cut_array), expect(cut_array, "", &[]));
        let got = run(streaming(&parser).as_mut(), &[cut_array]);
        assert_eq!(got, expect("", "", &[call("f", r#"{"a":1}"#)]));
    }

    #[test]
    fn arguments_keep_the_models_spelling() {
        let text = "[TOOL_CALLS]f[ARGS]{\"n\": 1.50, \"s\": \"\\u00e9 x\"}";
        assert_eq!(
            parse_all_splits(&parser, text),
            expect("", "", &[("f".into(), r#"{"n":1.50,"s":"\u00e9 x"}"#.into())])
        );
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
