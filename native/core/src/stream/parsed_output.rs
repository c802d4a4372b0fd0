//! One chat choice's output through its parser: the message it builds (content, reasoning, tool calls
//! with their ids) and, for streams, the pieces to send in order.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::agent::{OutputParser, Parsed};
use crate::openai::response::{ParsedMessage, ToolCall};

/// What a streamed choice sends next, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamPiece {
    Reasoning(String),
    Content(String),
    /// A call's first delta: its index among the choice's calls, id and name.
    CallStart {
        index: u32,
        id: String,
        name: String,
    },
    CallArguments {
        index: u32,
        fragment: String,
    },
}

pub struct ChoiceOutput {
    parser: Box<dyn OutputParser>,
    pub message: ParsedMessage,
    /// The parser's index of each call, by position in `message.tool_calls`.
    parser_indexes: Vec<u32>,
    /// `include_reasoning: false`: reasoning is parsed out of the text and not sent.
    leave_out_reasoning: bool,
}

impl ChoiceOutput {
    pub fn new(parser: Box<dyn OutputParser>, reasoning_parsed: bool) -> Self {
        ChoiceOutput {
            parser,
            message: ParsedMessage {
                reasoning_parsed,
                ..ParsedMessage::default()
            },
            parser_indexes: Vec::new(),
            leave_out_reasoning: false,
        }
    }

    /// With `leave_out`, reasoning is parsed out of the text and then dropped (streamed and not).
    pub fn leaving_out_reasoning(mut self, leave_out: bool) -> Self {
        self.leave_out_reasoning = leave_out;
        self
    }

    /// The next text of the choice (after detokenizing and stop strings).
    pub fn push(&mut self, text: &str) -> Vec<StreamPiece> {
        if text.is_empty() {
            return Vec::new();
        }
        let parsed = self.parser.push(text);
        self.take(parsed)
    }

    /// The choice has ended: what the parser held back.
    pub fn finish(&mut self) -> Vec<StreamPiece> {
        let parsed = self.parser.finish();
        self.take(parsed)
    }

    pub fn made_calls(&self) -> bool {
        !self.message.tool_calls.is_empty()
    }

    fn take(&mut self, parsed: Parsed) -> Vec<StreamPiece> {
        let mut pieces = Vec::new();
        if !parsed.reasoning.is_empty() && !self.leave_out_reasoning {
            self.message.reasoning.push_str(&parsed.reasoning);
            pieces.push(StreamPiece::Reasoning(parsed.reasoning));
        }
        if !parsed.content.is_empty() {
            self.message.content.push_str(&parsed.content);
            pieces.push(StreamPiece::Content(parsed.content));
        }
        for piece in parsed.calls {
            let position = match self.parser_indexes.iter().position(|&i| i == piece.index) {
                Some(position) => position,
                None => {
                    let call = ToolCall {
                        id: piece.id.clone().unwrap_or_else(new_call_id),
                        name: piece.name.clone().unwrap_or_default(),
                        arguments: String::new(),
                    };
                    let index = self.message.tool_calls.len() as u32;
                    pieces.push(StreamPiece::CallStart {
                        index,
                        id: call.id.clone(),
                        name: call.name.clone(),
                    });
                    self.parser_indexes.push(piece.index);
                    self.message.tool_calls.push(call);
                    self.message.tool_calls.len() - 1
                }
            };
            if !piece.arguments.is_empty() {
                self.message.tool_calls[position].arguments.push_str(&piece.arguments);
                pieces.push(StreamPiece::CallArguments {
                    index: position as u32,
                    fragment: piece.arguments,
                });
            }
        }
        pieces
    }
}

const ALPHANUMERICS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// `call_` and 24 random alphanumerics, unique in the process: three keyed hashes (std seeds the key from
/// the OS's random source once) of a counter and the slot, 8 characters from each.
pub fn new_call_id() -> String {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let key = KEY.get_or_init(RandomState::new);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    for slot in 0..3u8 {
        let mut h = key.hash_one((n, slot));
        for _ in 0..8 {
            id.push(ALPHANUMERICS[(h % 62) as usize] as char);
            h /= 62;
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::forced_calls::ForcedCallsParser;

    #[test]
    fn reasoning_left_out_is_neither_streamed_nor_in_the_message() {
        let think = || crate::agent::parser(None, Some(crate::agent::ReasoningFormat::Think), false);
        let mut out = ChoiceOutput::new(think(), true).leaving_out_reasoning(true);
        let mut pieces = out.push("<think>secret plan</thi");
        pieces.extend(out.push("nk>\n\nThe answer."));
        pieces.extend(out.finish());
        assert_eq!(pieces, [StreamPiece::Content("The answer.".into())]);
        assert_eq!(
            (out.message.reasoning.as_str(), out.message.content.as_str()),
            ("", "The answer.")
        );
        let mut kept = ChoiceOutput::new(think(), true);
        kept.push("<think>secret plan</think>\n\nThe answer.");
        kept.finish();
        assert_eq!(kept.message.reasoning, "secret plan");
    }

    #[test]
    fn call_ids_are_unique_alphanumerics() {
        let ids: Vec<String> = (0..2000).map(|_| new_call_id()).collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        for id in &ids {
            let tail = id.strip_prefix("call_").unwrap();
            assert_eq!(tail.len(), 24);
            assert!(tail.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        }
    }

    const HERMES: &str = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>";

    fn hermes(stream: bool, declared: &[&str]) -> ChoiceOutput {
        let mut parser = crate::agent::parser(Some(crate::agent::ToolFormat::Hermes), None, false);
        if stream {
            parser.stream_calls(Some(std::sync::Arc::new(
                declared.iter().map(|s| s.to_string()).collect(),
            )));
        }
        ChoiceOutput::new(parser, false)
    }

    /// (pieces, arguments concatenated) of a Hermes answer streamed in pieces of `size` bytes.
    fn streamed_in_pieces(size: usize, declared: &[&str]) -> (Vec<StreamPiece>, ChoiceOutput) {
        let mut out = hermes(true, declared);
        let mut pieces = Vec::new();
        let chars: Vec<char> = HERMES.chars().collect();
        for chunk in chars.chunks(size) {
            pieces.extend(out.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(out.finish());
        (pieces, out)
    }

    #[test]
    fn a_streamed_call_sends_its_name_first_then_argument_fragments_equal_to_the_whole_answer() {
        let mut whole = hermes(false, &[]);
        whole.push(HERMES);
        whole.finish();
        let expected = &whole.message.tool_calls[0].arguments;
        assert_eq!(expected, r#"{"city":"Paris","days":[1,2]}"#);
        for size in 1..=8 {
            let (pieces, out) = streamed_in_pieces(size, &["get_weather"]);
            let starts = pieces
                .iter()
                .filter(|p| matches!(p, StreamPiece::CallStart { .. }))
                .count();
            let fragments: Vec<&str> = pieces
                .iter()
                .filter_map(|p| match p {
                    StreamPiece::CallArguments { fragment, .. } => Some(fragment.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(starts, 1);
            assert_eq!(fragments.concat(), *expected, "pieces of {size}");
            assert!(
                fragments.len() >= 29 / size,
                "arguments stream as they arrive: {fragments:?}"
            );
            let first_call = pieces.iter().find(|p| !matches!(p, StreamPiece::Content(_)));
            assert!(matches!(first_call, Some(StreamPiece::CallStart { name, .. }) if name == "get_weather"));
            assert_eq!(out.message.content, "Checking.");
            let content: String = pieces
                .iter()
                .filter_map(|p| match p {
                    StreamPiece::Content(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(content, "Checking.");
        }
    }

    #[test]
    fn a_call_to_an_undeclared_tool_streams_whole() {
        let (pieces, _) = streamed_in_pieces(3, &["other"]);
        let calls: Vec<_> = pieces
            .iter()
            .filter(|p| !matches!(p, StreamPiece::Content(_)))
            .collect();
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert!(
            matches!(calls[1], StreamPiece::CallArguments { fragment, .. } if fragment == r#"{"city":"Paris","days":[1,2]}"#)
        );
    }

    #[test]
    fn calls_start_with_id_and_name_then_stream_arguments() {
        let mut out = ChoiceOutput::new(Box::new(ForcedCallsParser::new()), false);
        let mut pieces = out.push(r#"[{"name": "f", "parameters": {"a": 1}}, {"name": "g""#);
        pieces.extend(out.push(r#", "parameters": {}}]"#));
        pieces.extend(out.finish());
        let ids: Vec<&str> = out.message.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            pieces,
            [
                StreamPiece::CallStart {
                    index: 0,
                    id: ids[0].into(),
                    name: "f".into()
                },
                StreamPiece::CallArguments {
                    index: 0,
                    fragment: r#"{"a":1}"#.into()
                },
                StreamPiece::CallStart {
                    index: 1,
                    id: ids[1].into(),
                    name: "g".into()
                },
                StreamPiece::CallArguments {
                    index: 1,
                    fragment: "{}".into()
                },
            ]
        );
        assert!(out.made_calls() && out.message.content.is_empty());
    }
}
