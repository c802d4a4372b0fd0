//! DeepSeek V3 / R1 / V3.1 special-token calls, inside `<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`:
//! - V3 / R1: `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`;
//! - V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`.
//!
//! (The bars are U+FF5C and the spaces U+2581, as in DeepSeek's tokenizer.) Streaming: content as it
//! arrives; each call whole when its `<｜tool▁call▁end｜>` arrives; the section markers are dropped.

use super::scan::json_object;
use super::tagged::{Markers, Tagged};
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
    Some((name.to_string(), json_object(args)?))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits};
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
    fn malformed_and_truncated_calls_are_content() {
        let bad = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{nope}\n```<｜tool▁call▁end｜>";
        assert_eq!(parse_all_splits(&parser, bad), expect(bad, "", &[]));
        let cut = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":";
        let got = parse_all_splits(&parser, cut);
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
