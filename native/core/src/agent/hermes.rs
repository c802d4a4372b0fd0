//! Hermes / Qwen 2.5 (and Qwen3's non-coder models): each call is a JSON object in its own tag,
//! `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, text before and after allowed.
//!
//! Arguments are the model's JSON object text with the whitespace outside strings removed (arguments given
//! as a JSON string holding an object, or written before the name, are re-serialized compactly).
//!
//! Streaming: content as it arrives; in a stream the call's name once `{"name": "NAME", "arguments": ` has
//! arrived, then the arguments' text as it arrives; a whole answer gets each call whole when its
//! `</tool_call>` arrives.

use super::json_call::{decode, JsonCallReader};
use super::tagged::{Markers, Tagged};
use super::OutputParser;

pub fn parser() -> Box<dyn OutputParser> {
    Box::new(Tagged::new(
        Markers {
            section: None,
            call: ("<tool_call>", "</tool_call>"),
            reader: Some(|| Box::new(JsonCallReader::default())),
            call_id: None,
        },
        decode,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, long_plain_text_streams, parse_all_splits};
    use super::parser;

    // What Qwen2.5's chat template renders for an assistant message with content and two calls.
    const QWEN25: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\", \"fmt\": [1, 2]}}\n</tool_call>";

    #[test]
    fn template_rendering_with_two_calls() {
        let got = parse_all_splits(&parser, QWEN25);
        let calls = [
            call("get_weather", r#"{"city":"Paris"}"#),
            call("get_time", r#"{"tz":"Europe/Paris","fmt":[1,2]}"#),
        ];
        assert_eq!(got, expect("Let me check.", "", &calls));
    }

    #[test]
    fn text_after_calls_and_unicode() {
        let text =
            "é\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"日本 </tool\"}}\n</tool_call>\n\nDone ✓";
        let got = parse_all_splits(&parser, text);
        assert_eq!(got, expect("éDone ✓", "", &[call("f", r#"{"q":"日本 </tool"}"#)]));
    }

    #[test]
    fn plain_text_and_lookalike_markup_pass_through() {
        let text = "a <tool b <tool_cal> c <";
        assert_eq!(parse_all_splits(&parser, text), expect(text, "", &[]));
        long_plain_text_streams(&parser);
    }

    #[test]
    fn malformed_and_truncated_calls_are_content() {
        let bad = "x <tool_call>{\"name\": 1}</tool_call> y";
        assert_eq!(parse_all_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "x\n<tool_call>\n{\"name\": \"f\", \"argu";
        assert_eq!(parse_all_splits(&parser, cut), expect(cut, "", &[]));
        let not_json = "<tool_call>{oops}</tool_call>";
        assert_eq!(parse_all_splits(&parser, not_json), expect(not_json, "", &[]));
    }

    #[test]
    fn parameters_key_and_string_arguments_are_accepted() {
        let text = "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"b\\\": 2}\"}</tool_call>";
        let got = parse_all_splits(&parser, text);
        assert_eq!(got, expect("", "", &[call("f", r#"{"a":1}"#), call("g", r#"{"b":2}"#)]));
    }

    #[test]
    fn a_long_call_streamed_char_by_char() {
        let long = "z".repeat(100_000);
        let text = format!("<tool_call>{{\"name\": \"f\", \"arguments\": {{\"s\": \"{long}\"}}}}</tool_call>");
        let mut p = parser();
        let mut calls = 0;
        for c in text.chars() {
            calls += p.push(c.encode_utf8(&mut [0u8; 4])).calls.len();
        }
        assert_eq!(calls, 1);
        assert!(p.finish().is_empty());
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&parser, "", "");
        assert_linear(
            &parser,
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"",
            "\"}}</tool_call>",
        );
    }
}
