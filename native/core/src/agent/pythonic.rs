//! Pythonic calls (Llama 4, Llama 3.2 pythonic templates): the output is a Python list of calls with keyword
//! arguments, `[get_weather(city="Paris"), f2(x=1)]`, optionally between `<|python_start|>` and
//! `<|python_end|>`. Python literals become JSON: strings ('…' or "…"), numbers, True/False/None, lists,
//! tuples (→ arrays) and dicts. An output is calls only when it starts (after whitespace) with the list; a
//! list that is not a list of calls (positional arguments, expressions) comes back as content, exactly as
//! written, and so does any text after the list.
//!
//! Streaming: content as it arrives; all calls when the list closes (its extent is tracked as it streams,
//! Python strings included).

use serde_json::{Map, Number, Value};

use super::scan::{Content, Extent};
use super::{OutputParser, Parsed, ToolCallPiece};

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
}

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Pythonic {
        state: State::Start,
        buf: String::new(),
        raw: String::new(),
        body: String::new(),
        extent: Extent::python(),
        content: Content::default(),
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
                    let Some(end) = self.extent.advance(&self.body) else {
                        return;
                    };
                    let body = std::mem::take(&mut self.body);
                    self.buf = body[end..].to_string();
                    let raw = std::mem::take(&mut self.raw);
                    match parse_calls(&body[..end]) {
                        Some(calls) => {
                            for (index, (name, arguments)) in calls.into_iter().enumerate() {
                                out.calls.push(ToolCallPiece {
                                    index: index as u32,
                                    id: None,
                                    name: Some(name),
                                    arguments,
                                });
                            }
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
            State::Start | State::List => self.content.not_a_call(&rest, &mut out.content),
            _ => self.content.text(&rest, &mut out.content),
        }
        self.content.finish(&mut out.content);
        self.state = State::Text;
        out
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
        let mut args = Map::new();
        loop {
            self.ws();
            if self.eat(')').is_some() {
                break;
            }
            let key = self.ident()?.to_string();
            self.ws();
            self.eat('=')?;
            self.ws();
            let value = self.value()?;
            args.insert(key, value);
            self.ws();
            if self.eat(',').is_none() {
                self.ws();
                self.eat(')')?;
                break;
            }
        }
        Some((name, Value::Object(args).to_string()))
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
    use super::super::testutil::{assert_linear, call, expect, long_plain_text_streams, parse_all_splits};
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
            "[f(1)]",
            "[f(x=open('a'))]",
            "[f(x=1",
            "<|python_start|>hello",
            "Hello [f(x=1)]",
            "[]",
        ] {
            assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]), "{text}");
        }
        long_plain_text_streams(&parser);
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&parser, "", "");
        assert_linear(&parser, "[f(s='", "')]");
    }
}
