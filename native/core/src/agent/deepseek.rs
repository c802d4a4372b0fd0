//! DeepSeek V3 / R1 / V3.1 special-token calls, inside `<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`:
//! - V3 / R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`;
//! - V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`.
//!
//! (The bars are U+FF5C and the spaces U+2581, as in DeepSeek's tokenizer.) Arguments are the model's JSON
//! object text with the whitespace outside strings removed.
//!
//! Streaming: content as it arrives; in a stream the call's name once its arguments' `{` has arrived, then
//! their text as it arrives; a whole answer gets each call whole when its `<｜tool▁call▁end｜>` arrives.
//! The section markers are dropped.

use super::scan::{minified_object, Finder, MinifiedObject, ObjectState};
use super::tagged::{CallReader, Markers, Tagged};
use super::OutputParser;

pub(crate) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

pub fn parser() -> Box<dyn OutputParser> {
    let markers = Markers {
        section: Some((CALLS_BEGIN, CALLS_END)),
        call: (CALL_BEGIN, CALL_END),
        reader: Some(|| Box::new(Reader::default())),
        call_id: None,
    };
    Box::new(Tagged::new(markers, decode))
}

fn decode(body: &str) -> Option<(String, String)> {
    let (left, right) = body.split_once(SEP)?;
    let (name, args) = if left.trim() == "function" {
        let (name, rest) = right.split_once('\n')?;
        let rest = rest.trim().strip_prefix("```json")?.strip_suffix("```")?;
        (name.trim(), rest)
    } else {
        (left.trim(), right)
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    Some((name.to_string(), minified_object(args)?))
}

/// Streams a call: its name once its arguments open with `{`, then their text.
#[derive(Default)]
struct Reader {
    finder: Finder,
    /// (name, where the arguments' JSON starts), once known.
    head: Option<(String, usize)>,
    object: MinifiedObject,
    named: bool,
    gave_up: bool,
}

impl Reader {
    /// The name and where the arguments start: after the separator (V3.1), or after the name's line and
    /// the opening fence (V3 / R1).
    fn head(&mut self, body: &str) -> Option<(String, usize)> {
        let (sep, _) = self.finder.find(body, 0, &[SEP])?;
        let after = sep + SEP.len();
        if body[..sep].trim() != "function" {
            return Some((body[..sep].trim().to_string(), after));
        }
        let Some(newline) = body[after..].find('\n') else {
            self.gave_up = body.len() - after > 1024;
            return None;
        };
        let name = body[after..after + newline].trim().to_string();
        let rest = &body[after + newline + 1..];
        let fenced = rest.trim_start();
        if let Some(json) = fenced.strip_prefix("```json") {
            return Some((name, body.len() - json.len()));
        }
        self.gave_up = !"```json".starts_with(fenced);
        None
    }
}

impl CallReader for Reader {
    fn read(&mut self, body: &str, args: &mut String) -> Option<String> {
        if self.gave_up {
            return None;
        }
        if self.head.is_none() {
            self.head = self.head(body);
        }
        let (name, at) = self.head.as_ref()?;
        let state = self.object.feed(&body[*at..], args);
        if self.named || !matches!(state, ObjectState::Inside | ObjectState::Done) {
            return None;
        }
        self.named = true;
        (!name.is_empty() && !name.contains(char::is_whitespace)).then(|| name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits, parse_whole_splits, run, streaming};
    use super::parser;

    // What DeepSeek-V3's (and R1's) chat template renders for an assistant message with two calls.
    const V3: &str = "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    // DeepSeek-V3.1's rendering.
    const V31: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

    #[test]
    fn v3_template_rendering() {
        let got = parse_all_splits(&parser, V3);
        assert_eq!(
            got,
            expect(
                "Sure.",
                "",
                &[call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")]
            )
        );
    }

    #[test]
    fn v31_template_rendering_and_text_after() {
        let got = parse_all_splits(&parser, &format!("{V31}\nThat's all."));
        let calls = [call("get_weather", r#"{"city":"Paris"}"#), call("get_time", "{}")];
        assert_eq!(got, expect("That's all.", "", &calls));
    }

    #[test]
    fn a_stream_sends_the_name_then_the_arguments_as_they_arrive() {
        let mut p = streaming(&parser);
        let head =
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Pa";
        let first = p.push(head);
        assert_eq!(first.calls.len(), 1);
        assert_eq!(first.calls[0].name.as_deref(), Some("get_weather"));
        assert_eq!(first.calls[0].arguments, "{\"city\":\"Pa");
        let rest = p.push("ris\"}\n```<｜tool▁call▁end｜>");
        assert_eq!(
            (rest.calls[0].name.as_deref(), rest.calls[0].arguments.as_str()),
            (None, "ris\"}")
        );
        // A sent call whose body then turns out malformed stays as sent, its markup never content.
        let text =
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1} trailing\n```<｜tool▁call▁end｜>ok";
        let at = text.find(" trailing").unwrap();
        let got = run(streaming(&parser).as_mut(), &[&text[..at], &text[at..]]);
        assert_eq!(got, expect("ok", "", &[("f".into(), "{\"a\":1}".into())]));
    }

    #[test]
    fn malformed_and_truncated_calls_are_content() {
        let bad = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{nope}\n```<｜tool▁call▁end｜>";
        assert_eq!(parse_whole_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":";
        let got = parse_whole_splits(&parser, cut);
        assert_eq!(
            got,
            expect(
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":",
                "",
                &[]
            )
        );
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(
            &parser,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"s\": \"",
            "\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
    }
}
