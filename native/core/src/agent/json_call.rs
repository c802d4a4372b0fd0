//! A call written as one JSON object, `{"name": "NAME", "arguments": {...}}` (or `"parameters"`), read as
//! it streams: Hermes' tag bodies, Llama 3's calls, the elements of Mistral's array form and the calls a
//! forced `tool_choice` makes the engine write.
//!
//! The reader finds the name once the head `{"name": "NAME", "arguments": ` has arrived (the name must be
//! the object's first key), then copies the arguments object's text with the whitespace outside strings
//! removed. `decode` gives the whole answer the same arguments text when the reader could stream them, so
//! the streamed fragments and the whole answer's arguments are equal by construction.

use super::scan::{call_from_json, count_work, MinifiedObject, ObjectState};
pub(crate) use super::tagged::CallReader;

/// How long a head may grow before the reader gives up on it (the call then goes whole when it closes).
const MAX_HEAD: usize = 1024;

/// The object (its text, whitespace around it allowed) as a call: (name, arguments text), or None when it
/// is not a call. The arguments are the streamed text when the reader streams this object, else the
/// compact serialization of the parsed value (arguments given as a string holding an object, or written
/// before the name).
pub(crate) fn decode(body: &str) -> Option<(String, String)> {
    let (name, compact) = call_from_json(body)?;
    let mut reader = JsonCallReader::default();
    let mut args = String::new();
    let streamed = reader.read(body, &mut args);
    if streamed.as_deref() == Some(name.as_str()) && reader.object.1 == ObjectState::Done {
        return Some((name, args));
    }
    Some((name, compact))
}

/// The head of a call up to its arguments' value, as far as it has arrived.
pub(crate) enum Head {
    More,
    Not,
    /// The name, and the byte offset where the arguments' value starts.
    Found(String, usize),
}

/// `{"name": "NAME", "arguments": ` (or `"parameters"`), whitespace allowed between tokens.
pub(crate) fn head(body: &str) -> Head {
    let mut at = 0;
    let mut name = String::new();
    let steps: [&[&str]; 7] = [
        &["{"],
        &["\"name\""],
        &[":"],
        &["\""],
        &[],
        &[","],
        &["\"arguments\"", "\"parameters\""],
    ];
    for step in steps.iter().chain([&[":"] as &[&str]].iter()) {
        let rest = &body[at..];
        if step.is_empty() {
            // The name: up to its closing quote (a name needing escapes is not one a tool can have).
            match rest.find(['"', '\\']) {
                None => return Head::More,
                Some(end) if rest.as_bytes()[end] == b'"' && end > 0 => {
                    name = rest[..end].to_string();
                    at += end + 1;
                    continue;
                }
                Some(_) => return Head::Not,
            }
        }
        let trimmed = rest.trim_start();
        at += rest.len() - trimmed.len();
        if let Some(token) = step.iter().find(|t| trimmed.starts_with(**t)) {
            at += token.len();
        } else if step.iter().any(|t| t.starts_with(trimmed)) {
            return Head::More;
        } else {
            return Head::Not;
        }
    }
    Head::Found(name, at)
}

/// Streams a call object: its name once the head has arrived (with `at_object`, only once the arguments'
/// `{` has too, so `"arguments": [1]` or a string never sends a name), then its arguments object's text.
#[derive(Default)]
pub(crate) struct JsonCallReader {
    /// Where the arguments start, once the head is read.
    args_at: Option<usize>,
    object: (MinifiedObject, ObjectState),
    gave_up: bool,
    at_object: bool,
    /// The name read, not yet returned (`at_object`: the arguments have not opened yet).
    held: Option<String>,
}

impl JsonCallReader {
    /// A reader that returns the name only once the arguments object has opened.
    pub fn at_object() -> Self {
        JsonCallReader {
            at_object: true,
            ..Default::default()
        }
    }
}

impl CallReader for JsonCallReader {
    fn read(&mut self, body: &str, args: &mut String) -> Option<String> {
        if self.gave_up {
            return None;
        }
        let at = match self.args_at {
            Some(at) => at,
            None => match head(body) {
                Head::More if body.len() < MAX_HEAD => return None,
                Head::More | Head::Not => {
                    self.gave_up = true;
                    return None;
                }
                Head::Found(found, at) => {
                    self.held = Some(found);
                    self.args_at = Some(at);
                    at
                }
            },
        };
        self.object.1 = self.object.0.feed(&body[at..], args);
        match self.object.1 {
            ObjectState::Before if self.at_object => None,
            ObjectState::NotAnObject if self.at_object => {
                self.gave_up = true;
                None
            }
            _ => self.held.take(),
        }
    }
}

/// The objects of a JSON array as its text streams: where each element object opens and closes, each
/// byte scanned once (strings and escapes tracked). Fed the array's text from its `[`, each call a longer
/// version of the last.
#[derive(Default)]
pub(crate) struct Elements {
    pos: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    open: Option<usize>,
    /// Something other than objects, commas and whitespace stands in the array.
    pub stray: bool,
}

impl Elements {
    /// Scans on; the next element object that closes: (start, end just past its `}`).
    pub fn next_closed(&mut self, text: &str) -> Option<(usize, usize)> {
        let bytes = text.as_bytes();
        count_work(bytes.len().saturating_sub(self.pos));
        while self.pos < bytes.len() {
            let (b, at) = (bytes[self.pos], self.pos);
            self.pos += 1;
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
                b'"' => self.in_string = true,
                b'{' | b'[' => {
                    if b == b'{' && self.depth == 1 {
                        self.open = Some(at);
                    } else if self.depth == 1 {
                        self.stray = true;
                    }
                    self.depth += 1;
                }
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 1 {
                        if let Some(start) = self.open.take() {
                            return Some((start, self.pos));
                        }
                    }
                }
                b',' => {}
                b if b.is_ascii_whitespace() => {}
                _ if self.depth == 1 => self.stray = true,
                _ => {}
            }
            if self.depth == 1 && self.open.is_none() && b == b'"' {
                self.stray = true;
            }
        }
        None
    }

    /// Where the element object open now starts.
    pub fn open(&self) -> Option<usize> {
        self.open
    }
}

#[cfg(test)]
mod tests {
    use super::{decode, head, CallReader, Head, JsonCallReader};

    #[test]
    fn head_of_a_call() {
        let text = r#" { "name" : "f_1", "arguments" :"#;
        assert!(matches!(head(text), Head::Found(n, at) if n == "f_1" && at == text.len()));
        assert!(matches!(head(r#"{"name": "f", "param"#), Head::More));
        assert!(matches!(head(r#"{"arguments": {}, "name": "f"}"#), Head::Not));
        assert!(matches!(head(r#"{"name": "a\"b", "arguments": {}}"#), Head::Not));
    }

    #[test]
    fn the_name_waits_for_the_arguments_object_when_asked() {
        let mut reader = JsonCallReader::at_object();
        let mut args = String::new();
        assert_eq!(reader.read(r#"{"name": "f", "parameters": "#, &mut args), None);
        assert_eq!(
            reader.read(r#"{"name": "f", "parameters": { "a""#, &mut args),
            Some("f".into())
        );
        assert_eq!(args, r#"{"a""#);
        let mut not_object = JsonCallReader::at_object();
        assert_eq!(not_object.read(r#"{"name": "f", "parameters": [1]}"#, &mut args), None);
    }

    #[test]
    fn decode_keeps_the_models_spelling_when_the_name_comes_first() {
        let text = "{\"name\": \"f\", \"arguments\": {\"x\": 1.50, \"é\": \"\\u00e9\"}, \"id\": \"9\"}";
        assert_eq!(decode(text).unwrap().1, r#"{"x":1.50,"é":"\u00e9"}"#);
        // Arguments before the name: re-serialized.
        let late = "{\"arguments\": {\"x\": 1.50}, \"name\": \"f\"}";
        assert_eq!(decode(late).unwrap(), ("f".into(), r#"{"x":1.5}"#.into()));
    }
}
