//! Pythonic calls (Llama 4, Llama 3.2 pythonic templates): the output is a Python list of calls with keyword
//! arguments, `[get_weather(city="Paris"), f2(x=1)]`, optionally between `<|python_start|>` and
//! `<|python_end|>`. Python literals become JSON: strings ('…' or "…"), numbers, True/False/None, lists,
//! tuples (→ arrays) and dicts. An output is calls only when it starts (after whitespace) with the list; a
//! list that is not a list of calls (positional arguments, expressions) comes back as content, exactly as
//! written, and so does any text after the list.
//!
//! Arguments are the keyword arguments as a JSON object, in the order written (a keyword given twice, which
//! Python refuses, makes the list not calls).
//!
//! Streaming: content as it arrives. A whole answer gets all calls when the list closes (its extent is
//! tracked as it streams, Python strings included). A stream gets a call's name at its `(` (when it is a
//! declared tool), then one argument fragment per finished keyword argument, `{"K":V` / `,"K":V`, and `}`
//! (or `{}`) at its `)`. A call to an undeclared tool goes whole at its `)` once a call of the list was
//! sent, else when the list closes. Once a call was sent the list counts as calls: a part of it that is not
//! a call ends the calls there and the rest of the list is dropped as markup.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Number, Value};

use super::scan::{count_work, object_member, Content, Extent, Quoted};
use super::sent_call::{Calls, SentCall};
use super::{OutputParser, Parsed};

const START: &str = "<|python_start|>";
const END: &str = "<|python_end|>";

#[derive(PartialEq)]
enum State {
    Start,
    List,
    /// After the list: an optional end tag.
    End,
    Text,
}

pub struct Pythonic {
    state: State,
    buf: String,
    raw: String,
    body: String,
    extent: Extent,
    content: Content,
    calls: Calls,
    /// Streams: the list's calls as they arrive.
    list: ListScan,
}

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Pythonic {
        state: State::Start,
        buf: String::new(),
        raw: String::new(),
        body: String::new(),
        extent: Extent::python(),
        content: Content::default(),
        calls: Calls::default(),
        list: ListScan::default(),
    })
}

impl Pythonic {
    fn run(&mut self, out: &mut Parsed) {
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    let ws = self.buf.len() - t.len();
                    if self.raw.is_empty() && t.starts_with(START) {
                        self.content.text(&self.buf[..ws], &mut out.content);
                        self.content.open_call();
                        self.raw.push_str(START);
                        self.buf.drain(..ws + START.len());
                    } else if t.starts_with('[') {
                        if self.raw.is_empty() {
                            self.content.text(&self.buf[..ws], &mut out.content);
                            self.content.open_call();
                        } else {
                            self.raw.push_str(&self.buf[..ws]);
                        }
                        self.buf.drain(..ws);
                        self.state = State::List;
                    } else if t.is_empty() || (self.raw.is_empty() && START.starts_with(t)) {
                        return;
                    } else {
                        let raw = std::mem::take(&mut self.raw);
                        if !raw.is_empty() {
                            self.content.not_a_call(&raw, &mut out.content);
                        }
                        self.state = State::Text;
                    }
                }
                State::List => {
                    self.body.push_str(&self.buf);
                    self.buf.clear();
                    let end = self.extent.advance(&self.body);
                    if self.calls.streams() {
                        let upto = end.unwrap_or(self.body.len());
                        self.list.read(&self.body[..upto], &mut self.calls, out);
                    }
                    let Some(end) = end else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    let raw = std::mem::take(&mut self.raw);
                    match parse_calls(&body[..end]) {
                        Some(calls) => {
                            for (name, arguments) in calls.into_iter().skip(self.list.done) {
                                self.calls.whole(name, arguments, out);
                            }
                            self.content.call_boundary();
                            self.state = State::End;
                        }
                        // Calls of it were sent: they stay, the rest is markup.
                        None if self.list.committed => {
                            self.content.call_boundary();
                            self.state = State::End;
                        }
                        None => {
                            self.content
                                .not_a_call(&format!("{raw}{}", &body[..end]), &mut out.content);
                            self.state = State::Text;
                        }
                    }
                }
                State::End => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(END) {
                        self.buf = rest.to_string();
                        self.state = State::Text;
                    } else if t.is_empty() || END.starts_with(t) {
                        return;
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Text => {
                    self.content.text(&self.buf, &mut out.content);
                    self.buf.clear();
                    return;
                }
            }
        }
    }
}

impl OutputParser for Pythonic {
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
            // A list with calls sent that the output ends inside: they stay as sent.
            State::List if self.list.committed => self.content.call_boundary(),
            State::Start | State::List => self.content.not_a_call(&rest, &mut out.content),
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

/// The list in a stream: a scan of its text (Python strings tracked) that finds each call's name at its
/// `(` and each keyword argument when the `,` or `)` after it arrives, each parsed once.
#[derive(Default)]
struct ListScan {
    pos: usize,
    depth: u32,
    quoted: Quoted,
    /// Where the part being read starts: a call's name (depth 1) or a keyword argument (depth 2).
    part: usize,
    call: Option<PyCall>,
    /// A call closed at depth 1 and no `,` followed yet.
    after_call: bool,
    /// Calls that closed before any was sent, held for when the list closes (or a call is sent).
    held: Vec<(String, String)>,
    /// Calls announced (the list's first `done` calls).
    done: usize,
    /// A call of this list was sent: the list counts as calls.
    committed: bool,
    /// A part of the list was not a call: nothing more streams.
    failed: bool,
}

/// The call being read.
struct PyCall {
    name: String,
    /// Its arguments so far, when it does not stream.
    args: String,
    keys: HashSet<String>,
    sent: Option<SentCall>,
}

impl ListScan {
    /// Reads the list's text so far (from its `[`; each call a longer version of the last).
    fn read(&mut self, text: &str, calls: &mut Calls, out: &mut Parsed) {
        let bytes = text.as_bytes();
        count_work(bytes.len().saturating_sub(self.pos));
        while self.pos < bytes.len() && !self.failed {
            let (b, at) = (bytes[self.pos], self.pos);
            self.pos += 1;
            if self.quoted.inside(b) {
                continue;
            }
            match b {
                b'"' | b'\'' => self.quoted.open(b),
                b'(' if self.depth == 1 => {
                    let name = text[self.part..at].trim();
                    self.open_call(name, calls, out);
                    self.part = self.pos;
                    self.depth += 1;
                }
                b'[' if self.depth == 0 => {
                    self.depth = 1;
                    self.part = self.pos;
                }
                b'[' | b'{' | b'(' => self.depth += 1,
                b',' if self.depth == 2 => {
                    self.argument(&text[self.part..at], false, out);
                    self.part = self.pos;
                }
                b',' if self.depth == 1 => {
                    self.failed |= !std::mem::take(&mut self.after_call);
                    self.part = self.pos;
                }
                b')' if self.depth == 2 => {
                    self.argument(&text[self.part..at], true, out);
                    self.close_call(calls, out);
                    self.depth = 1;
                    self.part = self.pos;
                }
                b']' | b'}' | b')' => self.depth = self.depth.saturating_sub(1),
                b if b.is_ascii_whitespace() => {}
                _ => self.failed |= self.depth == 1 && self.after_call,
            }
            self.failed |= self.depth >= 2 && self.call.is_none();
        }
    }

    fn open_call(&mut self, name: &str, calls: &mut Calls, out: &mut Parsed) {
        let mut p = Py { s: name, i: 0 };
        if self.after_call || p.ident().is_none() || p.i != name.len() {
            self.failed = true;
            return;
        }
        let mut call = PyCall {
            name: name.to_string(),
            args: String::new(),
            keys: HashSet::new(),
            sent: None,
        };
        if calls.may_stream(name) {
            // The first call sent commits the list: the calls held before it go first.
            for (name, arguments) in self.held.drain(..) {
                calls.whole(name, arguments, out);
                self.done += 1;
            }
            self.committed = true;
            call.sent = Some(calls.start(name.to_string(), String::new(), out));
        }
        self.call = Some(call);
    }

    /// A keyword argument's text ended (by `,`, or by `)` when `last`).
    fn argument(&mut self, text: &str, last: bool, out: &mut Parsed) {
        let Some(call) = self.call.as_mut() else { return };
        if text.trim().is_empty() {
            // `f()` and a trailing comma are fine; an empty argument before a comma is not.
            self.failed |= !last;
            return;
        }
        let mut p = Py { s: text, i: 0 };
        let Some((key, value)) = p.keyword().filter(|_| {
            p.ws();
            p.i == text.len()
        }) else {
            self.failed = true;
            return;
        };
        if !call.keys.insert(key.clone()) {
            self.failed = true;
            return;
        }
        let mut member = String::new();
        object_member(call.keys.len() == 1, &key, &value, &mut member);
        match call.sent.as_mut() {
            Some(sent) => sent.more(&member, out),
            None => call.args.push_str(&member),
        }
    }

    fn close_call(&mut self, calls: &mut Calls, out: &mut Parsed) {
        let Some(mut call) = self.call.take().filter(|_| !self.failed) else {
            return;
        };
        let end = if call.keys.is_empty() { "{}" } else { "}" };
        self.after_call = true;
        match call.sent.as_mut() {
            Some(sent) => sent.more(end, out),
            None => {
                call.args.push_str(end);
                if self.committed {
                    calls.whole(call.name, call.args, out);
                } else {
                    self.held.push((call.name, call.args));
                    return;
                }
            }
        }
        self.done += 1;
    }
}

/// The calls of a Python list of calls: (name, arguments as a JSON object text) each.
fn parse_calls(text: &str) -> Option<Vec<(String, String)>> {
    let mut p = Py { s: text, i: 0 };
    p.eat('[')?;
    let mut calls = Vec::new();
    loop {
        p.ws();
        if p.eat(']').is_some() {
            break;
        }
        calls.push(p.call()?);
        p.ws();
        if p.eat(',').is_none() {
            p.ws();
            p.eat(']')?;
            break;
        }
    }
    p.ws();
    (p.i == text.len() && !calls.is_empty()).then_some(calls)
}

/// A cursor over a Python literal expression.
struct Py<'a> {
    s: &'a str,
    i: usize,
}

impl Py<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.i..].chars().next()
    }

    fn ws(&mut self) {
        while let Some(c) = self.peek().filter(|c| c.is_whitespace()) {
            self.i += c.len_utf8();
        }
    }

    fn eat(&mut self, c: char) -> Option<()> {
        (self.peek()? == c).then(|| self.i += c.len_utf8())
    }

    fn ident(&mut self) -> Option<&str> {
        let start = self.i;
        while let Some(c) = self
            .peek()
            .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '.' || *c == '-')
        {
            self.i += c.len_utf8();
        }
        let id = &self.s[start..self.i];
        (!id.is_empty() && !id.starts_with(|c: char| c.is_ascii_digit())).then_some(id)
    }

    fn call(&mut self) -> Option<(String, String)> {
        let name = self.ident()?.to_string();
        self.ws();
        self.eat('(')?;
        let mut keys = HashSet::new();
        let mut args = String::new();
        loop {
            self.ws();
            if self.eat(')').is_some() {
                break;
            }
            let (key, value) = self.keyword()?;
            if !keys.insert(key.clone()) {
                return None;
            }
            object_member(keys.len() == 1, &key, &value, &mut args);
            self.ws();
            if self.eat(',').is_none() {
                self.ws();
                self.eat(')')?;
                break;
            }
        }
        args.push_str(if keys.is_empty() { "{}" } else { "}" });
        Some((name, args))
    }

    /// `key=value` (whitespace allowed around `=`), from a non-whitespace character.
    fn keyword(&mut self) -> Option<(String, Value)> {
        self.ws();
        let key = self.ident()?.to_string();
        self.ws();
        self.eat('=')?;
        self.ws();
        Some((key, self.value()?))
    }

    fn value(&mut self) -> Option<Value> {
        match self.peek()? {
            '"' | '\'' => self.string().map(Value::String),
            '[' => self.seq('[', ']'),
            '(' => self.seq('(', ')'),
            '{' => self.dict(),
            c if c == '-' || c == '+' || c.is_ascii_digit() || c == '.' => self.number(),
            _ => match self.ident()? {
                "True" | "true" => Some(Value::Bool(true)),
                "False" | "false" => Some(Value::Bool(false)),
                "None" | "null" => Some(Value::Null),
                _ => None,
            },
        }
    }

    fn seq(&mut self, open: char, close: char) -> Option<Value> {
        self.eat(open)?;
        let mut items = Vec::new();
        loop {
            self.ws();
            if self.eat(close).is_some() {
                return Some(Value::Array(items));
            }
            items.push(self.value()?);
            self.ws();
            if self.eat(',').is_none() {
                self.ws();
                self.eat(close)?;
                return Some(Value::Array(items));
            }
        }
    }

    fn dict(&mut self) -> Option<Value> {
        self.eat('{')?;
        let mut map = Map::new();
        loop {
            self.ws();
            if self.eat('}').is_some() {
                return Some(Value::Object(map));
            }
            let key = match self.value()? {
                Value::String(s) => s,
                v @ (Value::Number(_) | Value::Bool(_) | Value::Null) => v.to_string(),
                _ => return None,
            };
            self.ws();
            self.eat(':')?;
            self.ws();
            map.insert(key, self.value()?);
            self.ws();
            if self.eat(',').is_none() {
                self.ws();
                self.eat('}')?;
                return Some(Value::Object(map));
            }
        }
    }

    fn number(&mut self) -> Option<Value> {
        let start = self.i;
        while let Some(c) = self.peek().filter(|c| c.is_ascii_alphanumeric() || "+-._".contains(*c)) {
            self.i += c.len_utf8();
        }
        let text: String = self.s[start..self.i].chars().filter(|c| *c != '_').collect();
        let text = text.strip_prefix('+').unwrap_or(&text);
        if let Ok(n) = text.parse::<i64>() {
            return Some(Value::Number(n.into()));
        }
        let f: f64 = text.parse().ok()?;
        Number::from_f64(f).map(Value::Number)
    }

    fn string(&mut self) -> Option<String> {
        let quote = self.peek()?;
        self.i += 1;
        let mut out = String::new();
        loop {
            let c = self.peek()?;
            self.i += c.len_utf8();
            match c {
                c if c == quote => return Some(out),
                '\\' => {
                    let e = self.peek()?;
                    self.i += e.len_utf8();
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        '\\' | '\'' | '"' => out.push(e),
                        'u' | 'x' => {
                            let n = if e == 'u' { 4 } else { 2 };
                            let hex = self.s.get(self.i..self.i + n)?;
                            out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
                            self.i += n;
                        }
                        '\n' => {}
                        other => {
                            out.push('\\');
                            out.push(other);
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{
        assert_linear, call, call_pieces, declaring, expect, long_plain_text_streams, parse_all_splits,
        parse_whole_splits, piece, run, streaming,
    };
    use super::parser;

    // What Llama 4's chat template renders for an assistant message with two calls.
    const RENDERED: &str = "[get_weather(city=\"Paris\", days=3), get_time(tz='Europe/Paris')]";

    #[test]
    fn template_rendering() {
        let got = parse_all_splits(&parser, RENDERED);
        let calls = [
            call("get_weather", r#"{"city":"Paris","days":3}"#),
            call("get_time", r#"{"tz":"Europe/Paris"}"#),
        ];
        assert_eq!(got, expect("", "", &calls));
    }

    #[test]
    fn python_literals_become_json() {
        let text = "<|python_start|>[f(a=True, b=None, c=[1, 2.5, -3], d={'k': (1, 'x')}, e=\"q\\\"]'\\n\", g=())]<|python_end|>";
        let got = parse_all_splits(&parser, text);
        let args = r#"{"a":true,"b":null,"c":[1,2.5,-3],"d":{"k":[1,"x"]},"e":"q\"]'\n","g":[]}"#;
        assert_eq!(got, expect("", "", &[call("f", args)]));
    }

    #[test]
    fn text_after_the_list_is_content() {
        let got = parse_all_splits(&parser, "[noop()]\n\nDone.");
        assert_eq!(got, expect("Done.", "", &[call("noop", "{}")]));
    }

    #[test]
    fn not_calls_are_content() {
        for text in [
            "[1, 2, 3]",
            "[(1)]",
            "[f x(a=1)]",
            "<|python_start|>hello",
            "Hello [f(x=1)]",
            "[]",
        ] {
            assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]), "{text}");
        }
        long_plain_text_streams(&parser);
    }

    #[test]
    fn malformed_lists_are_content_until_a_name_was_streamed() {
        // Whole: content. A stream sent `f` at its `(`: the call stays with the arguments sent, the rest of
        // the list is markup.
        for (text, streamed) in [
            ("[f(1)]", ""),
            ("[f(x=open('a'))]", ""),
            ("[f(x=1", ""),
            ("[f(x=1, y=2", "{\"x\":1"),
            ("[f(x=1, x=2)]", "{\"x\":1"),
            ("[f(x=1), 7] after", "{\"x\":1}"),
        ] {
            assert_eq!(parse_whole_splits(&parser, text), expect(text, "", &[]), "{text}");
            let got = run(streaming(&parser).as_mut(), &[text]);
            let content = if text.ends_with("after") { "after" } else { "" };
            assert_eq!(got, expect(content, "", &[("f".into(), streamed.into())]), "{text}");
        }
    }

    #[test]
    fn a_stream_sends_the_name_then_one_fragment_per_keyword_argument() {
        let parts = [
            "[get_weather(",
            "city=\"Par",
            "is\", da",
            "ys=3), get_time(",
            "tz='Europe/Paris')]",
        ];
        let got = call_pieces(streaming(&parser).as_mut(), &parts);
        assert_eq!(
            got,
            [
                vec![piece(0, Some("get_weather"), "")],
                vec![],
                vec![piece(0, None, "{\"city\":\"Paris\"")],
                vec![
                    piece(0, None, ",\"days\":3"),
                    piece(0, None, "}"),
                    piece(1, Some("get_time"), "")
                ],
                vec![piece(1, None, "{\"tz\":\"Europe/Paris\""), piece(1, None, "}")],
                vec![]
            ]
        );
    }

    #[test]
    fn undeclared_calls_are_held_until_a_call_streams_or_the_list_closes() {
        let parts = ["[a(x=1), b(", "y=2)]"];
        let got = call_pieces(declaring(&parser, &["b"]).as_mut(), &parts);
        assert_eq!(
            got,
            [
                vec![piece(0, Some("a"), "{\"x\":1}"), piece(1, Some("b"), "")],
                vec![piece(1, None, "{\"y\":2"), piece(1, None, "}")],
                vec![]
            ]
        );
        let got = call_pieces(declaring(&parser, &[]).as_mut(), &parts);
        assert_eq!(
            got[..2],
            [
                vec![],
                vec![piece(0, Some("a"), "{\"x\":1}"), piece(1, Some("b"), "{\"y\":2}")]
            ]
        );
        // Keyword arguments keep their order; trailing commas and spaces are fine.
        let text = "[ f ( z = 1 , a = [2, (3,)], ) , g() , ]";
        assert_eq!(
            parse_all_splits(&parser, text),
            expect(
                "",
                "",
                &[("f".into(), r#"{"z":1,"a":[2,[3]]}"#.into()), call("g", "{}")]
            )
        );
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&parser, "", "");
        assert_linear(&parser, "[f(s='", "')]");
    }
}
