//! Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
//! {...}<|tool_call_end|>...<|tool_calls_section_end|>`. The call id `functions.NAME:IDX` gives the name;
//! extproc makes its own `call_` ids.
//!
//! Streaming: content as it arrives; each call whole when its `<|tool_call_end|>` arrives; the section
//! markers are dropped.

use super::scan::json_object;
use super::tagged::{Markers, Tagged};
use super::OutputParser;

pub(crate) const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const CALL_END: &str = "<|tool_call_end|>";
const ARGS: &str = "<|tool_call_argument_begin|>";

pub fn parser() -> Box<dyn OutputParser> {
    let markers = Markers {
        section: Some((SECTION_BEGIN, SECTION_END)),
        call: (CALL_BEGIN, CALL_END),
    };
    Box::new(Tagged::new(markers, decode))
}

fn decode(body: &str) -> Option<(String, String)> {
    let (id, args) = body.split_once(ARGS)?;
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((name, idx)) if idx.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => id,
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    Some((name.to_string(), json_object(args)?))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits};
    use super::parser;

    // What Kimi-K2-Instruct's chat template renders for an assistant message with content and two calls.
    const RENDERED: &str = "Let me see.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{\"tz\": \"CET\"}<|tool_call_end|><|tool_calls_section_end|>";

    #[test]
    fn template_rendering() {
        let got = parse_all_splits(&parser, RENDERED);
        let calls = [
            call("get_weather", r#"{"city":"Paris"}"#),
            call("get_time", r#"{"tz":"CET"}"#),
        ];
        assert_eq!(got, expect("Let me see.", "", &calls));
    }

    #[test]
    fn malformed_and_truncated_calls_are_content() {
        let bad = "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>[1]<|tool_call_end|> after";
        assert_eq!(parse_all_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argu";
        let got = parse_all_splits(&parser, cut);
        assert_eq!(got, expect("<|tool_call_begin|>functions.f:0<|tool_call_argu", "", &[]));
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(
            &parser,
            "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"s\": \"",
            "\"}<|tool_call_end|>",
        );
    }
}
