//! GLM 4.5 / 4.6: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>`. The
//! template writes string values raw and others as JSON, so a value is the JSON it spells when it is valid
//! JSON, else the text as a string (a string argument that looks like JSON, e.g. "42", comes back as 42:
//! the schema that would disambiguate is not known here).
//! A key given twice makes the call malformed.
//!
//! Streaming: content as it arrives; in a stream the call's name once its first `<arg_key>` has arrived
//! (a call without arguments goes whole), then each argument as `{"K":V` / `,"K":V` once its
//! `</arg_value>` arrives, and `}` at `</tool_call>`; a whole answer gets each call whole when its
//! `</tool_call>` arrives.

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::scan::{loose_value, object_member, Finder};
use super::tagged::{CallReader, Markers, Tagged};
use super::OutputParser;

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Tagged::new(
        Markers {
            section: None,
            call: ("<tool_call>", "</tool_call>"),
            reader: Some(|| Box::new(Reader::default())),
            call_id: None,
        },
        decode,
    ))
}

const KEY: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VALUE: &str = "<arg_value>";
const VALUE_END: &str = "</arg_value>";

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(|c: char| c.is_whitespace() || c == '<' || c == '{')
}

fn decode(body: &str) -> Option<(String, String)> {
    let name_end = body.find(KEY).unwrap_or(body.len());
    let name = body[..name_end].trim();
    if !valid_name(name) {
        return None;
    }
    let mut args = Map::new();
    let mut rest = &body[name_end..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return Some((name.to_string(), Value::Object(args).to_string()));
        }
        let (key, after) = rest.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
        let (value, after) = after
            .trim_start()
            .strip_prefix("<arg_value>")?
            .split_once("</arg_value>")?;
        if args.insert(key.trim().to_string(), loose_value(value)).is_some() {
            return None;
        }
        rest = after;
    }
}

#[derive(Default)]
enum Step {
    #[default]
    Name,
    /// Before a key, at this offset.
    Between(usize),
    /// In a key starting at this offset.
    Key(usize),
    /// After the key `0`, before its value, at this offset.
    BeforeValue(String, usize),
    /// In the value of the key `0`, which starts at this offset.
    Value(String, usize),
    Done,
}

/// Streams a call: its name, then each argument once its value ends.
#[derive(Default)]
struct Reader {
    step: Step,
    finder: Finder,
    keys: HashSet<String>,
}

impl CallReader for Reader {
    fn read(&mut self, body: &str, args: &mut String) -> Option<String> {
        let mut name = None;
        loop {
            let waiting = match std::mem::take(&mut self.step) {
                Step::Name => match self.finder.find(body, 0, &[KEY]) {
                    None => Step::Name,
                    Some((at, _)) => {
                        let found = body[..at].trim();
                        if !valid_name(found) {
                            self.step = Step::Done;
                            return name;
                        }
                        name = Some(found.to_string());
                        self.step = Step::Key(at + KEY.len());
                        continue;
                    }
                },
                Step::Between(at) => {
                    let rest = body[at..].trim_start();
                    if let Some(key) = rest.strip_prefix(KEY) {
                        self.step = Step::Key(body.len() - key.len());
                        continue;
                    }
                    if !KEY.starts_with(rest) {
                        self.step = Step::Done;
                        return name;
                    }
                    Step::Between(at)
                }
                Step::Key(at) => match self.finder.find(body, at, &[KEY_END]) {
                    None => Step::Key(at),
                    Some((end, _)) => {
                        let key = body[at..end].trim().to_string();
                        self.step = Step::BeforeValue(key, end + KEY_END.len());
                        continue;
                    }
                },
                Step::BeforeValue(key, at) => {
                    let rest = body[at..].trim_start();
                    if let Some(value) = rest.strip_prefix(VALUE) {
                        self.step = Step::Value(key, body.len() - value.len());
                        continue;
                    }
                    if !VALUE.starts_with(rest) {
                        self.step = Step::Done;
                        return name;
                    }
                    Step::BeforeValue(key, at)
                }
                Step::Value(key, at) => match self.finder.find(body, at, &[VALUE_END]) {
                    None => Step::Value(key, at),
                    Some((end, _)) => {
                        if !self.keys.insert(key.clone()) {
                            self.step = Step::Done;
                            return name;
                        }
                        object_member(self.keys.len() == 1, &key, &loose_value(&body[at..end]), args);
                        self.step = Step::Between(end + VALUE_END.len());
                        continue;
                    }
                },
                Step::Done => {
                    self.step = Step::Done;
                    return name;
                }
            };
            self.step = waiting;
            return name;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits, parse_whole_splits, run, streaming};
    use super::parser;

    #[test]
    fn a_stream_sends_the_name_then_each_argument_as_it_ends() {
        let mut p = streaming(&parser);
        let pieces: Vec<_> = [
            "<tool_call>get_weather\n<arg_key>ci",
            "ty</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key><arg_value>3</arg_v",
            "alue>\n</tool_call>",
        ]
        .iter()
        .map(|t| p.push(t).calls)
        .collect();
        assert_eq!(pieces[0][0].name.as_deref(), Some("get_weather"));
        assert_eq!(pieces[1][0].arguments, "{\"city\":\"Paris\"");
        assert_eq!(pieces[2][0].arguments, ",\"days\":3}");
    }

    // What GLM-4.6's chat template renders for an assistant message with content and two calls.
    const RENDERED: &str = "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"c\"}</arg_value>\n</tool_call><tool_call>ping\n</tool_call>";

    #[test]
    fn template_rendering() {
        let got = parse_all_splits(&parser, RENDERED);
        let calls = [
            call("get_weather", r#"{"city":"Paris","days":3,"opts":{"unit":"c"}}"#),
            call("ping", "{}"),
        ];
        assert_eq!(got, expect("Checking.", "", &calls));
    }

    #[test]
    fn malformed_and_truncated_calls_are_content() {
        let bad = "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>";
        assert_eq!(parse_whole_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1";
        assert_eq!(parse_whole_splits(&parser, cut), expect(cut, "", &[]));
        // A stream keeps the call whose name it sent, with the arguments sent so far.
        let got = run(streaming(&parser).as_mut(), &[&cut[..20], &cut[20..]]);
        assert_eq!(got, expect("", "", &[("f".into(), String::new())]));
        let spaced = "<tool_call>two words</tool_call>";
        assert_eq!(parse_all_splits(&parser, spaced), expect(spaced, "", &[]));
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(
            &parser,
            "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>",
            "</arg_value>\n</tool_call>",
        );
    }
}
