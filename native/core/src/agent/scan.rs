//! Shared pieces of the incremental parsers: marker search that holds back a possible marker prefix, the
//! whitespace rule for content around calls, the extent of a JSON (or Python) value as it streams, and the
//! JSON-object → call conversion several formats share.
//!
//! Every helper works on the text not yet consumed plus at most a marker's length of held-back text, so a
//! parser built on them touches each byte of the output a bounded number of times (linear in the output).

use serde_json::{Map, Value};

#[cfg(test)]
thread_local! {
    /// Bytes examined by the searches below, on this thread: the linearity tests assert on it.
    pub(crate) static WORK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts `n` bytes examined (tests only).
#[inline]
pub(crate) fn count_work(n: usize) {
    #[cfg(test)]
    WORK.with(|w| w.set(w.get() + n));
    #[cfg(not(test))]
    let _ = n;
}

/// The earliest of `markers` in `hay`: (byte offset, marker index). On a tie the marker listed first wins.
pub(crate) fn find_first(hay: &str, markers: &[&str]) -> Option<(usize, usize)> {
    markers
        .iter()
        .enumerate()
        .filter_map(|(i, m)| hay.find(m).map(|p| (p, i)))
        .min()
}

/// Byte length of the longest suffix of `hay` that is a proper prefix of one of `markers`: that text is held
/// back, because the next delta may complete the marker.
pub(crate) fn partial_len(hay: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        let max = (m.len() - 1).min(hay.len());
        for k in (best + 1..=max).rev() {
            if m.is_char_boundary(k) && hay.ends_with(&m[..k]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// What a scan of the unconsumed text for markers found.
pub(crate) enum Scan {
    /// Marker `which` starts at byte `at`.
    Found { at: usize, which: usize },
    /// No marker: `buf[..safe]` is certainly text; the rest may be a marker's start.
    Text { safe: usize },
}

pub(crate) fn scan(buf: &str, markers: &[&str]) -> Scan {
    count_work(buf.len());
    match find_first(buf, markers) {
        Some((at, which)) => Scan::Found { at, which },
        None => Scan::Text {
            safe: buf.len() - partial_len(buf, markers),
        },
    }
}

/// How the output begins, for a parser whose format may open with one of `markers` (after whitespace).
pub(crate) enum Opening {
    /// A marker opens the output after `whitespace` bytes.
    Opens { whitespace: usize },
    /// Only whitespace or the start of a marker so far: wait for more.
    Undecided,
    /// The output is not opened by a marker.
    Not,
}

pub(crate) fn opening(buf: &str, markers: &[&str]) -> Opening {
    let head = buf.trim_start();
    if markers.iter().any(|m| head.starts_with(m)) {
        Opening::Opens {
            whitespace: buf.len() - head.len(),
        }
    } else if head.is_empty() || markers.iter().any(|m| m.starts_with(head)) {
        Opening::Undecided
    } else {
        Opening::Not
    }
}

/// Largest char boundary of `s` at or below `i`.
pub(crate) fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A growing text searched for one closing marker, each byte searched once (plus the marker's length of
/// overlap): the body of a call while its end has not arrived.
#[derive(Default)]
pub(crate) struct Body {
    pub text: String,
    searched: usize,
}

impl Body {
    /// Offset of `marker` in the body, searching only what earlier calls have not searched.
    pub fn find(&mut self, marker: &str) -> Option<usize> {
        self.find_any(&[marker]).map(|(at, _)| at)
    }

    /// The earliest of `markers` in the body (offset, index), searching only what earlier calls have not
    /// searched (less the longest marker's length, which may straddle the old end).
    pub fn find_any(&mut self, markers: &[&str]) -> Option<(usize, usize)> {
        let longest = markers.iter().map(|m| m.len()).max().unwrap_or(1);
        let from = floor_boundary(&self.text, self.searched.saturating_sub(longest - 1));
        count_work(self.text.len() - from);
        let found = find_first(&self.text[from..], markers).map(|(p, i)| (from + p, i));
        self.searched = self.text.len();
        found
    }

    /// The body so far, leaving it empty.
    pub fn take(&mut self) -> String {
        self.searched = 0;
        std::mem::take(&mut self.text)
    }
}

/// Content text with the whitespace that joins it to calls removed (what vLLM's parsers return): the
/// trailing whitespace before a call and the leading whitespace after one are dropped. Trailing whitespace
/// is held until the next non-space text (or the end) shows it is not followed by a call.
#[derive(Default)]
pub(crate) struct Content {
    pending_ws: String,
    /// The whitespace before a call being read, given back if it turns out not to be a call.
    join_ws: String,
    after_call: bool,
}

impl Content {
    pub fn text(&mut self, s: &str, out: &mut String) {
        let s = if self.after_call {
            let t = s.trim_start();
            if t.is_empty() {
                return;
            }
            self.after_call = false;
            t
        } else {
            s
        };
        let body = s.trim_end();
        if body.is_empty() {
            self.pending_ws.push_str(s);
            return;
        }
        out.push_str(&self.pending_ws);
        self.pending_ws.clear();
        out.push_str(body);
        self.pending_ws.push_str(&s[body.len()..]);
    }

    /// A call (or a calls section) starts or ends here: the whitespace around it is a join, not content.
    pub fn call_boundary(&mut self) {
        self.pending_ws.clear();
        self.join_ws.clear();
        self.after_call = true;
    }

    /// What may be a call starts here: the whitespace before it is set aside until it is decided.
    pub fn open_call(&mut self) {
        self.join_ws = std::mem::take(&mut self.pending_ws);
    }

    /// What looked like a call was not one: its text follows as content, joined as it was written.
    pub fn not_a_call(&mut self, raw: &str, out: &mut String) {
        let join = std::mem::take(&mut self.join_ws);
        self.pending_ws.insert_str(0, &join);
        self.text(raw, out);
    }

    pub fn finish(&mut self, out: &mut String) {
        out.push_str(&self.pending_ws);
        self.pending_ws.clear();
    }
}

/// Where a byte scan stands in quoted text: the open quote, if any, and whether the last byte was a
/// backslash inside it. Shared by the bracket scanners (`Extent`, the pythonic list's scan).
#[derive(Default)]
pub(crate) struct Quoted {
    quote: Option<u8>,
    escaped: bool,
}

impl Quoted {
    /// Takes `b` when a string is open (true: the caller skips it), closing the string at its quote.
    pub fn inside(&mut self, b: u8) -> bool {
        let Some(q) = self.quote else { return false };
        if self.escaped {
            self.escaped = false;
        } else if b == b'\\' {
            self.escaped = true;
        } else if b == q {
            self.quote = None;
        }
        true
    }

    pub fn open(&mut self, quote: u8) {
        self.quote = Some(quote);
    }
}

/// Where a JSON value (or, with `python`, a Python literal expression) that starts with a bracket ends, fed
/// the growing text and resuming where it stopped. Bytes are enough: every structural character is ASCII
/// and no byte of a multi-byte UTF-8 character is.
#[derive(Default)]
pub(crate) struct Extent {
    python: bool,
    depth: u32,
    quoted: Quoted,
    pos: usize,
}

impl Extent {
    pub fn python() -> Self {
        Extent {
            python: true,
            ..Default::default()
        }
    }

    /// Byte offset just past the value's closing bracket, once `text` holds it.
    pub fn advance(&mut self, text: &str) -> Option<usize> {
        let bytes = text.as_bytes();
        count_work(bytes.len().saturating_sub(self.pos));
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            self.pos += 1;
            if self.quoted.inside(b) {
                continue;
            }
            match b {
                b'"' => self.quoted.open(b),
                b'\'' if self.python => self.quoted.open(b),
                b'{' | b'[' => self.depth += 1,
                b'(' if self.python => self.depth += 1,
                b'}' | b']' | b')' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(self.pos);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

/// A call from a JSON object `{"name": ..., "arguments"|"parameters": {...}}`: (name, arguments serialized
/// compactly). Arguments given as a JSON string holding an object are accepted too; absent ones are `{}`.
pub(crate) fn call_from_object(obj: &Map<String, Value>) -> Option<(String, String)> {
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None => "{}".to_string(),
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v.to_string(),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some((name.to_string(), args))
}

/// A call from JSON text holding one such object.
pub(crate) fn call_from_json(text: &str) -> Option<(String, String)> {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Object(obj)) => call_from_object(&obj),
        _ => None,
    }
}

/// A parameter value written as text (Qwen3-Coder, GLM): the schema is unknown here, so the value is the
/// JSON it spells when it is valid JSON (`42`, `true`, `{"a": 1}`, `"x"`), else the text as a string.
pub(crate) fn loose_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// A JSON object's text as it streams, with the whitespace outside strings removed: the arguments a
/// call streams (and, run over the whole text, the arguments its whole answer carries, so the two are equal
/// by construction). Fed the growing text and resuming where it stopped; nothing is written before the
/// opening `{` nor after the matching `}`.
#[derive(Default)]
pub(crate) struct MinifiedObject {
    pos: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    state: ObjectState,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ObjectState {
    /// Only whitespace so far.
    #[default]
    Before,
    Inside,
    /// The matching `}` has passed.
    Done,
    /// The text does not open with `{`.
    NotAnObject,
}

impl MinifiedObject {
    /// Reads `text[pos..]` (text is the growing input, each call a longer version of the last), appending
    /// the kept bytes to `out`.
    pub fn feed(&mut self, text: &str, out: &mut String) -> ObjectState {
        let bytes = text.as_bytes();
        count_work(bytes.len().saturating_sub(self.pos));
        let mut run_start = self.pos;
        while self.pos < bytes.len() && matches!(self.state, ObjectState::Before | ObjectState::Inside) {
            let b = bytes[self.pos];
            let i = self.pos;
            self.pos += 1;
            if self.state == ObjectState::Before {
                if b.is_ascii_whitespace() {
                    run_start = self.pos;
                    continue;
                }
                if b != b'{' {
                    self.state = ObjectState::NotAnObject;
                    return self.state;
                }
                self.state = ObjectState::Inside;
                run_start = i;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {
                    out.push_str(&text[run_start..i]);
                    run_start = self.pos;
                }
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        out.push_str(&text[run_start..self.pos]);
                        self.state = ObjectState::Done;
                        return self.state;
                    }
                }
                _ => {}
            }
        }
        if self.state == ObjectState::Inside {
            // Bytes are copied up to a char boundary (inside a string a multi-byte char may be cut).
            let end = floor_boundary(text, self.pos);
            out.push_str(&text[run_start..end]);
            self.pos = end;
        }
        self.state
    }
}

/// `text` (one JSON object, whitespace around it allowed) with the whitespace outside strings removed,
/// if it is a valid JSON object.
pub(crate) fn minified_object(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut reader = MinifiedObject::default();
    if reader.feed(text, &mut out) != ObjectState::Done || !text[reader.pos..].trim().is_empty() {
        return None;
    }
    matches!(serde_json::from_str::<Value>(&out), Ok(Value::Object(_))).then_some(out)
}

/// A search for markers in a growing text that resumes where the last one stopped (less the longest
/// marker's length, which may straddle the old end), so each byte is searched a bounded number of times.
#[derive(Default)]
pub(crate) struct Finder {
    searched: usize,
}

impl Finder {
    /// The earliest of `markers` in `text[from..]` (offset in `text`, marker index).
    pub fn find(&mut self, text: &str, from: usize, markers: &[&str]) -> Option<(usize, usize)> {
        let longest = markers.iter().map(|m| m.len()).max().unwrap_or(1);
        let start = floor_boundary(text, self.searched.saturating_sub(longest - 1).max(from));
        count_work(text.len() - start);
        let found = find_first(&text[start..], markers).map(|(p, i)| (start + p, i));
        self.searched = match found {
            Some(_) => 0,
            None => text.len(),
        };
        found
    }
}

/// One more `"key":value` of an arguments object being streamed member by member (Qwen3-Coder, GLM):
/// `{` before the first, `,` before the others, as the compact serialization of the whole object writes it.
pub(crate) fn object_member(first: bool, key: &str, value: &Value, out: &mut String) {
    out.push(if first { '{' } else { ',' });
    out.push_str(&Value::String(key.to_string()).to_string());
    out.push(':');
    out.push_str(&value.to_string());
}
