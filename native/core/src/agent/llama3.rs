//! Llama 3.1 / 3.2 / 3.3 JSON calls: `{"name": "f", "parameters": {...}}` (or `"arguments"`), with or without a
//! leading `<|python_tag|>`, several separated by `;`. An output is calls when it starts (after whitespace)
//! with `{` or holds `<|python_tag|>`; text before the tag is content, a `{` later in the text is not a call.
//! A JSON object that is not a call (no name, arguments not an object) comes back as content, exactly as
//! written.
//!
//! Streaming: content as it arrives; each call whole when its JSON object closes (the object's extent is
//! tracked as it streams, strings and escapes included, so each byte is looked at once).

use super::scan::{call_from_json, opening, scan, Content, Extent, Opening, Scan};
use super::{OutputParser, Parsed, ToolCallPiece};

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
    calls: u32,
}

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Llama3 {
        state: State::Start,
        buf: String::new(),
        raw: String::new(),
        body: String::new(),
        extent: Extent::default(),
        content: Content::default(),
        calls: 0,
    })
}

impl Llama3 {
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
                    let Some(end) = self.extent.advance(&self.body) else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    let raw = std::mem::take(&mut self.raw);
                    match call_from_json(&body[..end]) {
                        Some((name, arguments)) => {
                            out.calls.push(ToolCallPiece {
                                index: self.calls,
                                id: None,
                                name: Some(name),
                                arguments,
                            });
                            self.calls += 1;
                            self.content.call_boundary();
                            self.state = State::Between;
                        }
                        None => {
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
            State::Between | State::Object => self.content.not_a_call(&rest, &mut out.content),
            _ => self.content.text(&rest, &mut out.content),
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
            "{\"name\": \"f\", \"parameters\": {\"x\": ",
            "ok <|python_ta",
        ] {
            assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]), "{text}");
        }
        long_plain_text_streams(&parser);
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
