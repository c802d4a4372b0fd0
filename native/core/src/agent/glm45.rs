//! GLM 4.5 / 4.6: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>`. The
//! template writes string values raw and others as JSON, so a value is the JSON it spells when it is valid
//! JSON, else the text as a string (a string argument that looks like JSON, e.g. "42", comes back as 42:
//! the schema that would disambiguate is not known here).
//!
//! Streaming: content as it arrives; each call whole when its `</tool_call>` arrives.

use serde_json::{Map, Value};

use super::scan::loose_value;
use super::tagged::{Markers, Tagged};
use super::OutputParser;

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Tagged::new(
        Markers {
            section: None,
            call: ("<tool_call>", "</tool_call>"),
        },
        decode,
    ))
}

fn decode(body: &str) -> Option<(String, String)> {
    let name_end = body.find("<arg_key>").unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '<' || c == '{') {
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
        args.insert(key.trim().to_string(), loose_value(value));
        rest = after;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits};
    use super::parser;

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
        assert_eq!(parse_all_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1";
        assert_eq!(parse_all_splits(&parser, cut), expect(cut, "", &[]));
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
