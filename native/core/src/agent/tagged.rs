//! The engine shared by the formats that wrap each call in an opening and a closing marker, optionally inside
//! a calls section (Hermes, Qwen3-Coder, GLM 4.5, DeepSeek, Kimi K2). A family supplies its markers and the
//! decoding of one call's body; the engine streams the text around calls as content and emits each call
//! whole (name and arguments in one piece) when its closing marker arrives and its body decodes. A body that
//! does not decode, or a call the output ends inside, comes back as content with its markers.

use super::scan::{scan, Body, Content, Scan};
use super::{OutputParser, Parsed, ToolCallPiece};

/// The markers of one family.
pub(crate) struct Markers {
    /// Opening and closing marker of a section holding the calls (dropped from the output).
    pub section: Option<(&'static str, &'static str)>,
    /// Opening and closing marker of one call.
    pub call: (&'static str, &'static str),
}

/// One call's body (the text between its markers) → (name, arguments JSON object text), or None when it is
/// not a well-formed call.
pub(crate) type Decode = fn(&str) -> Option<(String, String)>;

#[derive(Clone, Copy, PartialEq)]
enum State {
    Text,
    Section,
    Call { in_section: bool },
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
                    let (open, close) = self.markers.call;
                    let Some(end) = self.body.find(close) else { return };
                    let body = self.body.take();
                    self.buf = body[end + close.len()..].to_string();
                    match (self.decode)(&body[..end]) {
                        Some((name, arguments)) => {
                            out.calls.push(ToolCallPiece {
                                index: self.calls,
                                name: Some(name),
                                arguments,
                            });
                            self.calls += 1;
                            self.content.call_boundary();
                        }
                        None => {
                            let raw = format!("{open}{}{close}", &body[..end]);
                            self.content.not_a_call(&raw, &mut out.content);
                        }
                    }
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
            let raw = format!("{}{}{rest}", self.markers.call.0, self.body.take());
            self.content.not_a_call(&raw, &mut out.content);
        } else {
            self.content.text(&rest, &mut out.content);
        }
        self.content.finish(&mut out.content);
        self.state = State::Text;
        out
    }
}
