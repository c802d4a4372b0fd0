//! The engine shared by the formats that wrap each call in an opening and a closing marker, optionally inside
//! a calls section (Hermes, Qwen3-Coder, GLM 4.5, DeepSeek, Kimi K2). A family supplies its markers, the
//! decoding of one call's body and, for streams, a reader of the body as it grows; the engine streams the
//! text around calls as content.
//!
//! A whole answer (the default) gets each call whole when its closing marker arrives and its body decodes; a
//! body that does not decode, or a call the output ends inside, comes back as content with its markers.
//!
//! A stream (`stream_calls`) gets a call's name as soon as the reader has it (and, when the request declared
//! tools, it is one of them), then its argument text as it arrives; when the closing marker arrives the rest
//! of the decoded arguments follows, so the fragments concatenate to the whole answer's arguments. A call
//! whose name was sent and that then turns out malformed, or that the output ends inside, stays a call with
//! the arguments sent so far: a sent name cannot be taken back; its markup is dropped, never content.

use std::collections::HashSet;
use std::sync::Arc;

use super::scan::{partial_len, scan, Body, Content, Scan};
use super::{OutputParser, Parsed, ToolCallPiece};

/// The markers of one family, and how it reads a call.
pub(crate) struct Markers {
    /// Opening and closing marker of a section holding the calls (dropped from the output).
    pub section: Option<(&'static str, &'static str)>,
    /// Opening and closing marker of one call.
    pub call: (&'static str, &'static str),
    /// A reader of a call's body as it grows, for streams (None: calls stream whole).
    pub reader: Option<fn() -> Box<dyn CallReader>>,
    /// The call id the model wrote in the body, when the family writes one the client must send back.
    pub call_id: Option<fn(&str) -> Option<String>>,
}

/// One call's body (the text between its markers) → (name, arguments JSON object text), or None when it is
/// not a well-formed call.
pub(crate) type Decode = fn(&str) -> Option<(String, String)>;

/// Reads one call's body as it grows, for streams.
pub(crate) trait CallReader: Send {
    /// `body` is the call's body so far (each call a longer version of the last, never holding the closing
    /// marker). Returns the call's name the first time it is certain, and appends to `args` the argument
    /// text that is certain so far: a prefix of what `Decode` makes of the whole body, when that decodes.
    fn read(&mut self, body: &str, args: &mut String) -> Option<String>;
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Text,
    Section,
    Call { in_section: bool },
}

/// The call being read in a stream.
struct OpenCall {
    reader: Option<Box<dyn CallReader>>,
    /// The name sent, with the index it was sent under.
    sent: Option<(String, u32)>,
    /// Argument text sent.
    args: String,
}

pub(crate) struct Tagged {
    markers: Markers,
    decode: Decode,
    state: State,
    /// Received text not consumed yet (outside calls: at most a marker's length between pushes).
    buf: String,
    body: Body,
    content: Content,
    calls: u32,
    /// Streams calls as they are read (None: each call whole when it closes).
    stream: Option<Option<Arc<HashSet<String>>>>,
    open: Option<OpenCall>,
}

impl Tagged {
    pub fn new(markers: Markers, decode: Decode) -> Self {
        Tagged {
            markers,
            decode,
            state: State::Text,
            buf: String::new(),
            body: Body::default(),
            content: Content::default(),
            calls: 0,
            stream: None,
            open: None,
        }
    }

    fn start_call(&mut self) {
        let reader = match (&self.stream, self.markers.reader) {
            (Some(_), Some(make)) => Some(make()),
            _ => None,
        };
        self.open = reader.map(|reader| OpenCall {
            reader: Some(reader),
            sent: None,
            args: String::new(),
        });
    }

    /// Streams: what the reader makes of the body so far (less a possible start of the closing marker).
    fn read_open_call(&mut self, out: &mut Parsed) {
        let Some(open) = self.open.as_mut() else { return };
        let Some(reader) = open.reader.as_mut() else { return };
        let text = &self.body.text;
        let upto = text.len() - partial_len(text, &[self.markers.call.1]);
        let mut args = String::new();
        let name = reader.read(&text[..upto], &mut args);
        if let Some(name) = name {
            let known = match &self.stream {
                Some(Some(names)) => names.contains(&name),
                _ => true,
            };
            if !known {
                // Not a declared tool: the call goes whole when it closes, as in a whole answer.
                open.reader = None;
                return;
            }
            let id = self.markers.call_id.and_then(|f| f(&text[..upto]));
            open.args.push_str(&args);
            open.sent = Some((name.clone(), self.calls));
            out.calls.push(ToolCallPiece {
                index: self.calls,
                name: Some(name),
                id,
                arguments: args,
            });
            self.calls += 1;
        } else if let Some((_, index)) = &open.sent {
            if !args.is_empty() {
                open.args.push_str(&args);
                out.calls.push(ToolCallPiece {
                    index: *index,
                    name: None,
                    id: None,
                    arguments: args,
                });
            }
        }
    }

    /// A call's closing marker arrived after `body`.
    fn close_call(&mut self, body: &str, out: &mut Parsed) {
        let open = self.open.take();
        let sent = open
            .as_ref()
            .and_then(|o| o.sent.as_ref().map(|(name, index)| (name, *index, &o.args)));
        match ((self.decode)(body), sent) {
            (Some((name, arguments)), None) => {
                out.calls.push(ToolCallPiece {
                    index: self.calls,
                    name: Some(name),
                    id: self.markers.call_id.and_then(|f| f(body)),
                    arguments,
                });
                self.calls += 1;
                self.content.call_boundary();
            }
            (Some((name, arguments)), Some((sent_name, index, sent_args))) => {
                if name == *sent_name && arguments.starts_with(sent_args.as_str()) {
                    let rest = &arguments[sent_args.len()..];
                    if !rest.is_empty() {
                        out.calls.push(ToolCallPiece {
                            index,
                            name: None,
                            id: None,
                            arguments: rest.to_string(),
                        });
                    }
                }
                self.content.call_boundary();
            }
            // A sent call stays as sent; its markup is not content.
            (None, Some(_)) => self.content.call_boundary(),
            (None, None) => {
                let (open, close) = self.markers.call;
                let raw = format!("{open}{body}{close}");
                self.content.not_a_call(&raw, &mut out.content);
            }
        }
    }

    fn run(&mut self, out: &mut Parsed) {
        loop {
            match self.state {
                State::Text | State::Section => {
                    let (call_open, _) = self.markers.call;
                    let other = match (self.state, self.markers.section) {
                        (State::Text, Some((open, _))) => Some(open),
                        (State::Section, Some((_, close))) => Some(close),
                        _ => None,
                    };
                    let both = [call_open, other.unwrap_or("")];
                    let markers = if other.is_some() { &both[..] } else { &both[..1] };
                    match scan(&self.buf, markers) {
                        Scan::Found { at, which } => {
                            self.content.text(&self.buf[..at], &mut out.content);
                            if which == 0 {
                                self.content.open_call();
                                self.start_call();
                            } else {
                                self.content.call_boundary();
                            }
                            let len = markers[which].len();
                            self.buf.drain(..at + len);
                            self.state = match (which, self.state) {
                                (0, s) => State::Call {
                                    in_section: s == State::Section,
                                },
                                (_, State::Text) => State::Section,
                                _ => State::Text,
                            };
                        }
                        Scan::Text { safe } => {
                            self.content.text(&self.buf[..safe], &mut out.content);
                            self.buf.drain(..safe);
                            return;
                        }
                    }
                }
                State::Call { in_section } => {
                    self.body.text.push_str(&self.buf);
                    self.buf.clear();
                    let close = self.markers.call.1;
                    let Some(end) = self.body.find(close) else {
                        self.read_open_call(out);
                        return;
                    };
                    let body = self.body.take();
                    self.buf = body[end + close.len()..].to_string();
                    self.close_call(&body[..end], out);
                    self.state = if in_section { State::Section } else { State::Text };
                }
            }
        }
    }
}

impl OutputParser for Tagged {
    fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        self.buf.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let rest = std::mem::take(&mut self.buf);
        if let State::Call { .. } = self.state {
            let body = self.body.take();
            let sent = self.open.take().is_some_and(|o| o.sent.is_some());
            if sent {
                // A sent call the output ends inside stays as sent; its markup is not content.
                self.content.call_boundary();
            } else {
                let raw = format!("{}{body}{rest}", self.markers.call.0);
                self.content.not_a_call(&raw, &mut out.content);
            }
        } else {
            self.content.text(&rest, &mut out.content);
        }
        self.content.finish(&mut out.content);
        self.state = State::Text;
        out
    }

    fn stream_calls(&mut self, declared: Option<Arc<HashSet<String>>>) {
        self.stream = Some(declared);
    }
}
