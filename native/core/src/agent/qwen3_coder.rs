//! Qwen3-Coder XML calls: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n
//! </tool_call>`. The tool's schema is not known here, so a value is the JSON it spells when it is valid JSON
//! (`42`, `true`, `[1]`, `{"a": 1}`), else the text as a string; one newline after `<parameter=P>` and one
//! before `</parameter>` are the template's, not the value's. A missing `</parameter>` is tolerated (the next
//! `<parameter=` or `</function>` ends the value), as the model sometimes omits it. A parameter named twice
//! makes the call malformed.
//!
//! Streaming: content as it arrives; in a stream the call's name once `<function=NAME>` has arrived, then
//! each parameter as `{"P":VALUE` / `,"P":VALUE` once it ends, and `}` at `</function>` (the compact
//! serialization of the whole answer's arguments, piece by piece); a whole answer gets each call whole when
//! its `</tool_call>` arrives.

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

const FUNCTION: &str = "<function=";
const PARAMETER: &str = "<parameter=";
const VALUE_ENDS: [&str; 3] = ["</parameter>", "<parameter=", "</function>"];

/// A parameter's value as written → its text (one newline after `<parameter=P>` and one before its end
/// are the template's).
fn value_text(raw: &str) -> &str {
    let raw = raw.strip_prefix('\n').unwrap_or(raw);
    raw.strip_suffix('\n').unwrap_or(raw)
}

#[derive(Default)]
enum Step {
    #[default]
    Name,
    /// Between parameters, at this offset.
    Between(usize),
    /// In the value of the parameter `key`, which starts at this offset.
    Value(String, usize),
    Done,
}

/// Streams a call: its name, then each parameter once it ends.
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
            match std::mem::take(&mut self.step) {
                Step::Name => {
                    let head = body.trim_start();
                    let Some(rest) = head.strip_prefix(FUNCTION) else {
                        self.step = if FUNCTION.starts_with(head) {
                            Step::Name
                        } else {
                            Step::Done
                        };
                        return name;
                    };
                    let Some(end) = rest.find('>').filter(|_| rest.len() < 1024) else {
                        self.step = if rest.len() < 1024 { Step::Name } else { Step::Done };
                        return name;
                    };
                    let found = rest[..end].trim();
                    if found.is_empty() || found.contains(char::is_whitespace) {
                        self.step = Step::Done;
                        return name;
                    }
                    name = Some(found.to_string());
                    self.step = Step::Between(body.len() - rest.len() + end + 1);
                }
                Step::Between(at) => {
                    let rest = body[at..].trim_start();
                    if rest.starts_with("</function>") {
                        args.push_str(if self.keys.is_empty() { "{}" } else { "}" });
                        self.step = Step::Done;
                        return name;
                    }
                    let key = rest.strip_prefix(PARAMETER).and_then(|r| r.split_once('>'));
                    match key {
                        Some((key, value)) if self.keys.insert(key.trim().to_string()) => {
                            self.step = Step::Value(key.trim().to_string(), body.len() - value.len());
                        }
                        Some(_) => {
                            self.step = Step::Done;
                            return name;
                        }
                        None => {
                            let waiting = (rest.starts_with(PARAMETER) && rest.len() < 1024)
                                || PARAMETER.starts_with(rest)
                                || "</function>".starts_with(rest);
                            self.step = if waiting { Step::Between(at) } else { Step::Done };
                            return name;
                        }
                    }
                }
                Step::Value(key, at) => {
                    let Some((end, which)) = self.finder.find(body, at, &VALUE_ENDS) else {
                        self.step = Step::Value(key, at);
                        return name;
                    };
                    let value = loose_value(value_text(&body[at..end]));
                    object_member(self.keys.len() == 1, &key, &value, args);
                    let skip = if which == 0 { VALUE_ENDS[0].len() } else { 0 };
                    self.step = Step::Between(end + skip);
                }
                Step::Done => {
                    self.step = Step::Done;
                    return name;
                }
            }
        }
    }
}

fn decode(body: &str) -> Option<(String, String)> {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, mut rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("</function>") {
            if !after.trim().is_empty() {
                return None;
            }
            return Some((name.to_string(), Value::Object(args).to_string()));
        }
        let (key, after) = rest.strip_prefix("<parameter=")?.split_once('>')?;
        let end = ["</parameter>", "<parameter=", "</function>"]
            .iter()
            .filter_map(|m| after.find(m))
            .min()?;
        if args
            .insert(key.trim().to_string(), loose_value(value_text(&after[..end])))
            .is_some()
        {
            return None;
        }
        rest = &after[end..];
        rest = rest.strip_prefix("</parameter>").unwrap_or(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits, parse_whole_splits, run, streaming};
    use super::parser;

    #[test]
    fn a_stream_sends_the_name_then_each_parameter_as_it_ends() {
        let mut p = streaming(&parser);
        let pieces: Vec<_> = [
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            "is\n</parameter>\n<parameter=days>\n3\n</param",
            "eter>\n</function>\n</tool_call>",
        ]
        .iter()
        .map(|t| p.push(t).calls)
        .collect();
        assert_eq!(pieces[0][0].name.as_deref(), Some("get_weather"));
        assert_eq!(pieces[0][0].arguments, "");
        assert_eq!(pieces[1][0].arguments, "{\"city\":\"Paris\"");
        assert_eq!(pieces[2][0].arguments, ",\"days\":3}");
    }

    // What Qwen3-Coder's chat template renders for an assistant message with content and two calls (it
    // writes non-string values with tojson).
    const RENDERED: &str = "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>";

    #[test]
    fn template_rendering() {
        let got = parse_all_splits(&parser, RENDERED);
        let calls = [
            call("get_weather", r#"{"city":"Paris","days":3,"opts":{"unit":"c"}}"#),
            call("noop", "{}"),
        ];
        assert_eq!(got, expect("I'll look.", "", &calls));
    }

    #[test]
    fn multiline_values_and_missing_parameter_close() {
        let text = "<tool_call>\n<function=write>\n<parameter=code>\nline 1\n\nline 2\n</parameter>\n<parameter=path>\na.py\n<parameter=n>\nnull\n</function>\n</tool_call>\nafter";
        let got = parse_all_splits(&parser, text);
        let args = r#"{"code":"line 1\n\nline 2","path":"a.py","n":null}"#;
        assert_eq!(got, expect("after", "", &[call("write", args)]));
    }

    #[test]
    fn malformed_and_truncated_calls_are_content() {
        let bad = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>";
        assert_eq!(parse_whole_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "ok\n<tool_call>\n<function=f>\n<parameter=a>\n1";
        assert_eq!(parse_whole_splits(&parser, cut), expect(cut, "", &[]));
        let twice = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(parse_whole_splits(&parser, twice), expect(twice, "", &[]));
        // A stream keeps the call whose name it sent, with the parameters sent so far.
        let at = bad.find("</tool_call>").unwrap();
        let got = run(streaming(&parser).as_mut(), &[&bad[..at], &bad[at..]]);
        assert_eq!(got, expect("", "", &[("f".into(), "{\"a\":1".into())]));
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(
            &parser,
            "<tool_call>\n<function=f>\n<parameter=s>\n",
            "\n</parameter>\n</function>\n</tool_call>",
        );
    }
}
