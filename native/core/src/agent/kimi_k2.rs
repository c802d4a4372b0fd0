//! Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>
//! {...}<|tool_call_end|>...<|tool_calls_section_end|>`. The call id `functions.NAME:IDX` gives the name,
//! and is the id the answer gives the call: Kimi's template writes a past call's id back as its
//! `functions.NAME:IDX`, so the next turn's prompt shows the model what it wrote. Arguments are the model's
//! JSON object text with the whitespace outside strings removed.
//!
//! Streaming: content as it arrives; in a stream the call's name (and id) once its arguments' `{` has
//! arrived, then their text as it arrives; a whole answer gets each call whole when its `<|tool_call_end|>`
//! arrives. The section markers are dropped.

use super::scan::{minified_object, Finder, MinifiedObject, ObjectState};
use super::tagged::{CallReader, Markers, Tagged};
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
        reader: Some(|| Box::new(Reader::default())),
        call_id: Some(call_id),
    };
    Box::new(Tagged::new(markers, decode))
}

fn decode(body: &str) -> Option<(String, String)> {
    let (id, args) = body.split_once(ARGS)?;
    Some((name_of(id)?.to_string(), minified_object(args)?))
}

/// The id the model wrote before the arguments, as it wrote it (`functions.get_weather:0`).
fn call_id(body: &str) -> Option<String> {
    let (id, _) = body.split_once(ARGS)?;
    name_of(id)?;
    Some(id.trim().to_string())
}

/// `functions.NAME:IDX` → NAME.
fn name_of(id: &str) -> Option<&str> {
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((name, idx)) if idx.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => id,
    };
    (!name.is_empty() && !name.contains(char::is_whitespace)).then_some(name)
}

/// Streams a call: its name once its arguments open with `{`, then their text.
#[derive(Default)]
struct Reader {
    finder: Finder,
    args_at: Option<usize>,
    object: MinifiedObject,
    named: bool,
}

impl CallReader for Reader {
    fn read(&mut self, body: &str, args: &mut String) -> Option<String> {
        let at = match self.args_at {
            Some(at) => at,
            None => {
                let (at, _) = self.finder.find(body, 0, &[ARGS])?;
                self.args_at = Some(at + ARGS.len());
                at + ARGS.len()
            }
        };
        let state = self.object.feed(&body[at..], args);
        if self.named || !matches!(state, ObjectState::Inside | ObjectState::Done) {
            return None;
        }
        self.named = true;
        name_of(&body[..at - ARGS.len()]).map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, parse_all_splits, parse_whole_splits, run, streaming};
    use super::parser;

    #[test]
    fn ids_are_the_models_own() {
        let mut p = parser();
        let got = p.push(RENDERED);
        let ids: Vec<_> = got.calls.iter().map(|c| c.id.as_deref()).collect();
        assert_eq!(ids, [Some("functions.get_weather:0"), Some("functions.get_time:1")]);
        // A stream sends the id with the name, before the arguments are complete.
        let mut p = streaming(&parser);
        let first =
            p.push("<|tool_calls_section_begin|><|tool_call_begin|> functions.f:3 <|tool_call_argument_begin|>{\"a\"");
        assert_eq!(first.calls[0].id.as_deref(), Some("functions.f:3"));
        assert_eq!(first.calls[0].name.as_deref(), Some("f"));
        assert_eq!(first.calls[0].arguments, "{\"a\"");
    }

    #[test]
    fn a_stream_keeps_a_sent_call_that_is_cut_short() {
        let text =
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": [1, ";
        let got = run(
            streaming(&parser).as_mut(),
            &[&text[..text.len() - 4], &text[text.len() - 4..]],
        );
        assert_eq!(got, expect("", "", &[("f".into(), "{\"a\":[1,".into())]));
    }

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
        let got = parse_whole_splits(&parser, cut);
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
