//! Llama 3.1 / 3.2 / 3.3 JSON calls: `{"name": "f", "parameters": {...}}` (or `"arguments"`), with or without a
//! leading `<|python_tag|>`, several separated by `;`. An output is calls when it starts (after whitespace)
//! with `{` or holds `<|python_tag|>`; text before the tag is content, a `{` later in the text is not a call.
//! A JSON object that is not a call (no name, arguments not an object) comes back as content, exactly as
//! written.
//!
//! Arguments are the model's JSON object text with the whitespace outside strings removed (arguments given
//! as a JSON string holding an object, or written before the name, are re-serialized compactly).
//!
//! Streaming: content as it arrives. A whole answer gets each call whole when its JSON object closes (the
//! object's extent is tracked as it streams, strings and escapes included, so each byte is looked at once).
//! A stream gets the call's name once `{"name": "NAME", "parameters": {` has arrived (when it is a declared
//! tool), then the arguments' text as it arrives. Name-first needs `"name"` to be the object's first key: a
//! call written `{"parameters": {...}, "name": "f"}` goes whole when its object closes, as in a whole answer.

use std::collections::HashSet;
use std::sync::Arc;

use super::json_call::{decode, JsonCallReader};
use super::scan::{opening, scan, Content, Extent, Opening, Scan};
use super::sent_call::{Calls, SentCall};
use super::tagged::CallReader;
use super::{OutputParser, Parsed};

const TAG: &str = "<|python_tag|>";

#[derive(PartialEq)]
enum State {
    Start,
    Text,
    /// After the tag or a call: whitespace and `;` until the next object.
    Between,
    Object,
}

pub struct Llama3 {
    state: State,
    buf: String,
    /// The tag and separators consumed since the last call, given back as content if no call follows.
    raw: String,
    body: String,
    extent: Extent,
    content: Content,
    calls: Calls,
    /// Streams: the reader of the call object being read (None once it is known not to stream).
    reader: Option<JsonCallReader>,
    /// Streams: the call object being read, once its name was sent.
    sent: Option<SentCall>,
}

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Llama3 {
        state: State::Start,
        buf: String::new(),
        raw: String::new(),
        body: String::new(),
        extent: Extent::default(),
        content: Content::default(),
        calls: Calls::default(),
        reader: None,
        sent: None,
    })
}

impl Llama3 {
    /// Streams: what the reader makes of the call object so far (up to its end, once known).
    fn read_call(&mut self, end: Option<usize>, out: &mut Parsed) {
        let Some(reader) = self.reader.as_mut() else { return };
        let mut args = String::new();
        let name = reader.read(&self.body[..end.unwrap_or(self.body.len())], &mut args);
        match (name, self.sent.as_mut()) {
            (Some(name), _) if self.calls.may_stream(&name) => self.sent = Some(self.calls.start(name, args, out)),
            // Not a declared tool: the call goes whole when it closes.
            (Some(_), _) => self.reader = None,
            (None, Some(sent)) => sent.more(&args, out),
            (None, None) => {}
        }
    }

    fn run(&mut self, out: &mut Parsed) {
        loop {
            match self.state {
                State::Start => match opening(&self.buf, &[TAG, "{"]) {
                    Opening::Opens { whitespace } => {
                        self.content.text(&self.buf[..whitespace], &mut out.content);
                        self.content.open_call();
                        self.buf.drain(..whitespace);
                        self.state = State::Between;
                    }
                    Opening::Undecided => return,
                    Opening::Not => self.state = State::Text,
                },
                State::Text => match scan(&self.buf, &[TAG]) {
                    Scan::Found { at, .. } => {
                        self.content.text(&self.buf[..at], &mut out.content);
                        self.content.open_call();
                        self.buf.drain(..at);
                        self.state = State::Between;
                    }
                    Scan::Text { safe } => {
                        self.content.text(&self.buf[..safe], &mut out.content);
                        self.buf.drain(..safe);
                        return;
                    }
                },
                State::Between => {
                    if self.buf.starts_with(TAG) {
                        self.raw.push_str(TAG);
                        self.buf.drain(..TAG.len());
                    }
                    let t = self.buf.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    let skipped = self.buf.len() - t.len();
                    if t.starts_with('{') {
                        self.raw.push_str(&self.buf[..skipped]);
                        self.buf.drain(..skipped);
                        self.extent = Extent::default();
                        self.reader = self.calls.streams().then(JsonCallReader::at_object);
                        self.sent = None;
                        self.state = State::Object;
                    } else if t.is_empty() || (self.buf.len() < TAG.len() && TAG.starts_with(self.buf.as_str())) {
                        return;
                    } else {
                        let raw = std::mem::take(&mut self.raw);
                        self.content.not_a_call(&raw, &mut out.content);
                        self.state = State::Text;
                    }
                }
                State::Object => {
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let end = self.extent.advance(&self.body);
                    self.read_call(end, out);
                    let Some(end) = end else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    let raw = std::mem::take(&mut self.raw);
                    let decoded = decode(&body[..end]);
                    match (self.sent.take(), decoded) {
                        (Some(sent), decoded) => {
                            // A sent call stays a call, malformed or not; its markup is not content.
                            sent.close(decoded, out);
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        (None, Some((name, arguments))) => {
                            self.calls.whole(name, arguments, out);
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        (None, None) => {
                            self.content
                                .not_a_call(&format!("{raw}{}", &body[..end]), &mut out.content);
                            self.state = State::Text;
                        }
                    }
                }
            }
        }
    }
}

impl OutputParser for Llama3 {
    fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        self.buf.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let rest = format!(
            "{}{}{}",
            std::mem::take(&mut self.raw),
            std::mem::take(&mut self.body),
            self.buf
        );
        self.buf.clear();
        match self.state {
            // A sent call the output ends inside stays as sent.
            State::Object if self.sent.take().is_some() => self.content.call_boundary(),
            State::Between | State::Object => self.content.not_a_call(&rest, &mut out.content),
            _ => self.content.text(&rest, &mut out.content),
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

    // What Llama 3.1's chat template renders for an assistant call (`{"name": ..., "parameters": ...}`),
    // as the model writes it after the python tag.
    const RENDERED: &str = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";

    #[test]
    fn template_rendering() {
        let got = parse_all_splits(&parser, RENDERED);
        assert_eq!(got, expect("", "", &[call("get_weather", r#"{"city":"Paris"}"#)]));
    }

    #[test]
    fn bare_json_and_several_calls() {
        let text = "\n{\"name\": \"f\", \"parameters\": {\"s\": \"a}b\\\"{\"}}; {\"name\": \"g\", \"arguments\": {}}";
        let got = parse_all_splits(&parser, text);
        assert_eq!(got, expect("", "", &[call("f", r#"{"s":"a}b\"{"}"#), call("g", "{}")]));
    }

    #[test]
    fn text_before_the_tag_and_after_the_calls() {
        let text = "Calling now.\n<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}\nDone.";
        let got = parse_all_splits(&parser, text);
        assert_eq!(got, expect("Calling now.Done.", "", &[call("f", r#"{"x":1}"#)]));
    }

    #[test]
    fn not_calls_are_content() {
        for text in [
            "{\"answer\": 42}",
            "The set {1, 2} has two elements.",
            "{\"name\": \"f\", \"parameters\": [1]} then text",
            "<|python_tag|>print('hi')",
            "{\"name\": \"f\", \"parameters\": \"x\"} then",
            "ok <|python_ta",
        ] {
            assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]), "{text}");
        }
        long_plain_text_streams(&parser);
    }
    #[test]
    fn a_stream_sends_the_name_then_the_arguments_as_they_arrive() {
        let parts = [
            "Calling.\n<|python_tag|>{\"name\": \"get_weather\", \"param",
            "eters\": {\"city\": \"Pa",
            "ris\", \"days\": 2}}; {\"name\": \"g\", \"parameters\": {}}",
        ];
        let got = call_pieces(streaming(&parser).as_mut(), &parts);
        assert_eq!(
            got,
            [
                vec![],
                vec![piece(0, Some("get_weather"), "{\"city\":\"Pa")],
                vec![piece(0, None, "ris\",\"days\":2}"), piece(1, Some("g"), "{}")],
                vec![]
            ]
        );
        // Streamed == whole at every split point.
        let text = parts.concat();
        let calls = [call("get_weather", r#"{"city":"Paris","days":2}"#), call("g", "{}")];
        assert_eq!(parse_all_splits(&parser, &text), expect("Calling.", "", &calls));
    }

    #[test]
    fn parameters_before_the_name_and_undeclared_tools_go_whole() {
        // Name-first needs "name" as the first key: otherwise the call goes whole when its object closes.
        let late = "{\"parameters\": {\"x\": 1.50}, \"name\": \"f\"}";
        let at = late.len() - 1;
        let got = call_pieces(streaming(&parser).as_mut(), &[&late[..at], &late[at..]]);
        assert_eq!(got, [vec![], vec![piece(0, Some("f"), r#"{"x":1.5}"#)], vec![]]);
        assert_eq!(
            parse_all_splits(&parser, late),
            expect("", "", &[call("f", r#"{"x":1.5}"#)])
        );
        let at = RENDERED.len() - 2;
        let got = call_pieces(
            declaring(&parser, &["other"]).as_mut(),
            &[&RENDERED[..at], &RENDERED[at..]],
        );
        assert_eq!(
            got,
            [
                vec![],
                vec![piece(0, Some("get_weather"), r#"{"city":"Paris"}"#)],
                vec![]
            ]
        );
    }

    #[test]
    fn a_truncated_call_is_content_until_its_name_was_streamed() {
        let cut = "ok <|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": ";
        assert_eq!(parse_whole_splits(&parser, cut), expect(cut, "", &[]));
        // A stream sent the name: the call stays, with the fragments sent; no markup in content.
        let got = run(streaming(&parser).as_mut(), &[cut]);
        assert_eq!(got, expect("ok", "", &[("f".into(), "{\"x\":".into())]));
        let malformed = "{\"name\": \"f\", \"parameters\": {\"x\": 1} oops}";
        assert_eq!(parse_whole_splits(&parser, malformed), expect(malformed, "", &[]));
        let got = run(streaming(&parser).as_mut(), &[malformed]);
        assert_eq!(got, expect("", "", &[("f".into(), "{\"x\":1}".into())]));
    }

    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&parser, "", "");
        assert_linear(
            &parser,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"s\": \"",
            "\"}}",
        );
    }
}
