//! gpt-oss Harmony: the output is a sequence of messages, each a header then `<|message|>` then a body ended
//! by `<|end|>`, `<|return|>` or `<|call|>` (the prompt ends with `<|start|>assistant`, so the first header
//! has no `<|start|>`):
//! - `<|channel|>analysis<|message|>…<|end|>` → reasoning;
//! - `<|channel|>final<|message|>…<|return|>` → content; a `commentary` message with no recipient (a
//!   preamble) → content too;
//! - `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>` → a
//!   call (the recipient may also stand before `<|channel|>`, as the format allows);
//! - a message to another recipient (the built-in `browser.*` / `python` tools, which extproc does not
//!   enable) → its body as content.
//!
//! Text outside any message (an output not in Harmony form) is content; stray end markers there are dropped. A call whose body is not a JSON object comes back as content (its
//! body); an output that ends inside a header drops that header (it is markup only); one that ends inside a
//! call's body gives the body back as content.
//!
//! Arguments are the model's JSON object text with the whitespace outside strings removed.
//!
//! Streaming: reasoning and content as they arrive, holding back only what may start a marker. A whole
//! answer gets each call whole when `<|call|>` arrives. A stream gets the call's name (known from the
//! header's `to=functions.NAME`, when it is a declared tool) once its body opens with `{`, then the
//! arguments' text as it arrives; a sent call that turns out malformed or cut off stays a call with the
//! fragments sent (a body that does not open with `{` is content, as in a whole answer).

use std::collections::HashSet;
use std::sync::Arc;

use super::scan::{minified_object, opening, partial_len, scan, Body, MinifiedObject, ObjectState, Opening, Scan};
use super::sent_call::{Calls, SentCall};
use super::{OutputParser, Parsed};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";
/// What ends a message body: its end markers, or (when the model skipped them) the next header.
const BODY_ENDS: [&str; 5] = [END, RETURN, CALL, START, CHANNEL];

#[derive(Clone, PartialEq)]
enum Kind {
    Reasoning,
    Content,
    Call(String),
}

#[derive(Clone, PartialEq)]
enum State {
    Text,
    Header,
    Message(Kind),
}

pub struct Harmony {
    state: State,
    buf: String,
    /// The header being read, or the body of a call being read.
    body: Body,
    calls: Calls,
    /// Streams: the arguments of the call being read, while they may stream.
    object: Option<MinifiedObject>,
    /// Streams: the call being read, once its name was sent.
    sent: Option<SentCall>,
    /// Whether the start of the output has been read: the prompt ends with `<|start|>assistant`, so the
    /// model may go on with that header's recipient (` to=functions.NAME<|channel|>…`) before any marker.
    started: bool,
}

/// How the output begins when it continues the prompt's open header with a recipient.
const RECIPIENT: &str = "to=";

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Harmony {
        state: State::Text,
        buf: String::new(),
        body: Body::default(),
        calls: Calls::default(),
        object: None,
        sent: None,
        started: false,
    })
}

/// What a header says the message is.
fn kind(header: &str) -> Kind {
    let word_after = |marker: &str| -> Option<&str> {
        let at = header.find(marker)? + marker.len();
        let rest = &header[at..];
        let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
        Some(&rest[..end])
    };
    let recipient = header
        .match_indices("to=")
        .find(|(i, _)| *i == 0 || header[..*i].ends_with(|c: char| c.is_whitespace() || c == '>'))
        .map(|(i, _)| {
            let rest = &header[i + 3..];
            &rest[..rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len())]
        });
    match (recipient, word_after(CHANNEL)) {
        (Some(r), _) => match r.strip_prefix("functions.") {
            Some(name) if !name.is_empty() => Kind::Call(name.to_string()),
            _ => Kind::Content,
        },
        (None, Some("analysis")) => Kind::Reasoning,
        _ => Kind::Content,
    }
}

impl Harmony {
    /// Streams: the call's body so far (up to its end, once found; else less a possible marker start).
    fn read_call(&mut self, name: &str, end: Option<usize>, out: &mut Parsed) {
        let Some(object) = self.object.as_mut() else { return };
        let text = &self.body.text;
        let upto = end.unwrap_or(text.len() - partial_len(text, &BODY_ENDS));
        let mut args = String::new();
        let state = object.feed(&text[..upto], &mut args);
        match (self.sent.as_mut(), state) {
            (Some(sent), _) => sent.more(&args, out),
            (None, ObjectState::Inside | ObjectState::Done) => {
                self.sent = Some(self.calls.start(name.to_string(), args, out));
            }
            (None, ObjectState::NotAnObject) => self.object = None,
            (None, ObjectState::Before) => {}
        }
    }

    fn run(&mut self, out: &mut Parsed) {
        loop {
            if !self.started {
                match opening(&self.buf, &[RECIPIENT]) {
                    Opening::Opens { .. } => self.state = State::Header,
                    Opening::Undecided => return,
                    Opening::Not => {}
                }
                self.started = true;
            }
            match self.state.clone() {
                State::Text => match scan(&self.buf, &BODY_ENDS) {
                    Scan::Found { at, which } => {
                        out.content.push_str(&self.buf[..at]);
                        // A stray end marker is dropped; a `<|start|>` opens a header; a `<|channel|>`
                        // belongs to the header it starts.
                        let skip = if which == 4 { at } else { at + BODY_ENDS[which].len() };
                        self.buf.drain(..skip);
                        if which >= 3 {
                            self.state = State::Header;
                        }
                    }
                    Scan::Text { safe } => {
                        out.content.push_str(&self.buf[..safe]);
                        self.buf.drain(..safe);
                        return;
                    }
                },
                State::Header => {
                    self.body.text.push_str(&self.buf);
                    self.buf.clear();
                    let Some(at) = self.body.find(MESSAGE) else { return };
                    let header = self.body.take();
                    self.buf = header[at + MESSAGE.len()..].to_string();
                    let kind = kind(&header[..at]);
                    self.object = match &kind {
                        Kind::Call(name) if self.calls.may_stream(name) => Some(MinifiedObject::default()),
                        _ => None,
                    };
                    self.sent = None;
                    self.state = State::Message(kind);
                }
                State::Message(Kind::Call(name)) => {
                    self.body.text.push_str(&self.buf);
                    self.buf.clear();
                    let found = self.body.find_any(&BODY_ENDS);
                    self.read_call(&name, found.map(|(at, _)| at), out);
                    let Some((at, which)) = found else {
                        return;
                    };
                    let body = self.body.take();
                    let ends_here = which < 3;
                    let marker_len = if ends_here { BODY_ENDS[which].len() } else { 0 };
                    self.buf = body[at + marker_len..].to_string();
                    let decoded = minified_object(&body[..at]);
                    match (self.sent.take(), decoded) {
                        // A sent call stays a call, malformed or not.
                        (Some(sent), decoded) => sent.close(decoded.map(|a| (name, a)), out),
                        (None, Some(arguments)) => self.calls.whole(name, arguments, out),
                        (None, None) => out.content.push_str(&body[..at]),
                    }
                    self.state = State::Text;
                }
                State::Message(kind) => {
                    let sink = if kind == Kind::Reasoning {
                        &mut out.reasoning
                    } else {
                        &mut out.content
                    };
                    match scan(&self.buf, &BODY_ENDS) {
                        Scan::Found { at, which } => {
                            sink.push_str(&self.buf[..at]);
                            let skip = if which < 3 { at + BODY_ENDS[which].len() } else { at };
                            self.buf.drain(..skip);
                            self.state = State::Text;
                        }
                        Scan::Text { safe } => {
                            sink.push_str(&self.buf[..safe]);
                            self.buf.drain(..safe);
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl OutputParser for Harmony {
    fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        self.buf.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let rest = std::mem::take(&mut self.buf);
        match &self.state {
            State::Header => {
                self.body.take();
            }
            State::Message(Kind::Reasoning) => out.reasoning.push_str(&rest),
            // A sent call the output ends inside stays as sent.
            State::Message(Kind::Call(_)) if self.sent.take().is_some() => {
                self.body.take();
            }
            State::Message(Kind::Call(_)) => {
                out.content.push_str(&self.body.take());
                out.content.push_str(&rest);
            }
            _ => out.content.push_str(&rest),
        }
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

    // What gpt-oss's chat template renders for an assistant turn that thinks and calls a tool (the prompt's
    // `<|start|>assistant` removed, as the model's output starts after it).
    const CALL: &str = "<|channel|>analysis<|message|>Need the weather. Call get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    const ANSWER: &str = "<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>";

    #[test]
    fn reasoning_then_a_call() {
        let got = parse_all_splits(&parser, CALL);
        assert_eq!(
            got,
            expect(
                "",
                "Need the weather. Call get_weather.",
                &[call("get_weather", r#"{"city":"Paris"}"#)]
            )
        );
    }

    #[test]
    fn reasoning_then_final_answer() {
        let got = parse_all_splits(&parser, ANSWER);
        assert_eq!(got, expect("Hello! How can I help?", "Simple greeting.", &[]));
    }

    #[test]
    fn preamble_two_calls_and_recipient_before_channel() {
        let text = "<|channel|>commentary<|message|>Checking two things.<|end|><|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"x\": [1, \"<|end|>\"]}<|call|>";
        let got = parse_whole_splits(&parser, text);
        // A marker inside a JSON string still ends the message (special tokens are not text): b's body is cut.
        assert_eq!(got.content, "Checking two things.{\"x\": [1, \"\"]}");
        assert_eq!(got.calls, vec![call("a", "{}")]);
        // A stream sent b's name when its body opened: b stays a call with the text sent.
        let got = run(streaming(&parser).as_mut(), &[text]);
        assert_eq!(got.content, "Checking two things.\"]}");
        assert_eq!(got.calls, vec![call("a", "{}"), ("b".into(), "{\"x\":[1,\"".into())]);
    }

    #[test]
    fn output_that_continues_the_prompts_header_with_a_recipient_is_a_call() {
        // The prompt ends with `<|start|>assistant`; gpt-oss's template writes past calls this way too.
        let text = " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>";
        let got = parse_all_splits(&parser, text);
        assert_eq!(got.calls, vec![call("get_weather", "{\"city\":\"Paris\"}")]);
        assert_eq!(got.content, "");
        // Text that merely starts like a recipient is text.
        assert_eq!(parse_all_splits(&parser, "tomorrow").content, "tomorrow");
    }

    #[test]
    fn malformed_and_truncated() {
        let bad = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>";
        assert_eq!(parse_whole_splits(&parser, bad), expect("{oops", "", &[]));
        let cut_call = "<|channel|>commentary to=functions.f<|message|>{\"a\":";
        assert_eq!(parse_whole_splits(&parser, cut_call), expect("{\"a\":", "", &[]));
        // A stream sent the name when the body opened with `{`: the call stays with what was sent.
        let got = run(streaming(&parser).as_mut(), &[bad]);
        assert_eq!(got, expect("", "", &[("f".into(), "{oops".into())]));
        let got = run(streaming(&parser).as_mut(), &[cut_call]);
        assert_eq!(got, expect("", "", &[("f".into(), "{\"a\":".into())]));
        // A body that is not an object is content, streamed or not.
        let not_object = "<|channel|>commentary to=functions.f<|message|>sure<|call|>";
        assert_eq!(parse_all_splits(&parser, not_object), expect("sure", "", &[]));
        let cut_header = "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|chan";
        assert_eq!(parse_all_splits(&parser, cut_header), expect("", "hmm", &[]));
        let cut_reasoning = "<|channel|>analysis<|message|>still thinking";
        assert_eq!(
            parse_all_splits(&parser, cut_reasoning),
            expect("", "still thinking", &[])
        );
        let builtin = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\": 1}<|call|>";
        assert_eq!(parse_all_splits(&parser, builtin), expect("{\"q\": 1}", "x", &[]));
    }

    #[test]
    fn text_outside_messages_is_content() {
        let text = "<|channel|>final<|message|>hi<|return|> trailing";
        assert_eq!(parse_all_splits(&parser, text), expect("hi trailing", "", &[]));
        let plain = "no harmony here <|chan";
        assert_eq!(parse_all_splits(&parser, plain), expect(plain, "", &[]));
        long_plain_text_streams(&parser);
    }
    #[test]
    fn a_stream_sends_the_name_then_the_arguments_as_they_arrive() {
        let at = CALL.find("Pa").unwrap();
        let got = call_pieces(streaming(&parser).as_mut(), &[&CALL[..at], &CALL[at..]]);
        assert_eq!(
            got,
            [
                vec![piece(0, Some("get_weather"), "{\"city\":\"")],
                vec![piece(0, None, "Paris\"}")],
                vec![]
            ]
        );
        // A tool the request did not declare goes whole at `<|call|>`.
        let got = call_pieces(declaring(&parser, &["other"]).as_mut(), &[&CALL[..at], &CALL[at..]]);
        assert_eq!(
            got,
            [
                vec![],
                vec![piece(0, Some("get_weather"), r#"{"city":"Paris"}"#)],
                vec![]
            ]
        );
        // The end marker arriving in pieces is never argument text.
        let text = "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}<|ca";
        let got = call_pieces(streaming(&parser).as_mut(), &[text, "ll|>"]);
        assert_eq!(got, [vec![piece(0, Some("f"), "{\"a\":1}")], vec![], vec![]]);
    }

    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&parser, "", "");
        assert_linear(&parser, "<|channel|>analysis<|message|>", "<|end|>");
        assert_linear(
            &parser,
            "<|channel|>commentary to=functions.f<|message|>{\"s\": \"",
            "\"}<|call|>",
        );
    }
}
