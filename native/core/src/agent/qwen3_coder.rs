//! Qwen3-Coder XML calls: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n
//! </tool_call>`. The tool's schema is not known here, so a value is the JSON it spells when it is valid JSON
//! (`42`, `true`, `[1]`, `{"a": 1}`), else the text as a string; one newline after `<parameter=P>` and one
//! before `</parameter>` are the template's, not the value's. A missing `</parameter>` is tolerated (the next
//! `<parameter=` or `</function>` ends the value), as the model sometimes omits it.
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
        let raw = &after[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        args.insert(key.trim().to_string(), loose_value(raw));
        rest = &after[end..];
        rest = rest.strip_prefix("</parameter>").unwrap_or(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits};
    use super::parser;

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
        assert_eq!(parse_all_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "ok\n<tool_call>\n<function=f>\n<parameter=a>\n1";
        assert_eq!(parse_all_splits(&parser, cut), expect(cut, "", &[]));
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
