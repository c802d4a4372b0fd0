//! `<think>...</think>` reasoning (DeepSeek R1, Qwen3, GLM 4.5, Kimi K2 Thinking), composed with the parser
//! of what follows it: the text after `</think>` is handed to the inner (tool-call or pass-through) parser,
//! the reasoning never is.
//!
//! With `prompt_opens_think` (the rendered prompt already ends with `<think>`: DeepSeek R1's newer template,
//! Qwen3 with thinking on in some templates) the output starts inside the reasoning; otherwise the output is
//! reasoning only when it starts (after whitespace) with `<think>`, and is all content when it does not (a
//! `</think>` the model never opened stays content). Whitespace joining the reasoning to its markers and the
//! content to `</think>` is dropped. An output that ends inside the reasoning is all reasoning.
//!
//! Streaming: reasoning and content as they arrive, holding back only what may be the start of a marker.

use super::scan::{opening, scan, Content, Opening, Scan};
use super::{OutputParser, Parsed};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(PartialEq)]
enum State {
    /// Output not yet known to open a think block.
    Start,
    Reasoning,
    /// After the reasoning (or without one): everything goes to the inner parser.
    After,
}

pub struct Think {
    inner: Box<dyn OutputParser>,
    state: State,
    buf: String,
    reasoning: Content,
    /// The whitespace after `</think>` has not all passed yet.
    trim_content: bool,
}

impl Think {
    pub fn new(inner: Box<dyn OutputParser>, prompt_opens_think: bool) -> Self {
        let mut reasoning = Content::default();
        reasoning.call_boundary();
        Think {
            inner,
            state: if prompt_opens_think {
                State::Reasoning
            } else {
                State::Start
            },
            buf: String::new(),
            reasoning,
            trim_content: false,
        }
    }

    fn feed_inner(&mut self, text: &str, out: &mut Parsed) {
        let text = if self.trim_content {
            let t = text.trim_start();
            if t.is_empty() {
                return;
            }
            self.trim_content = false;
            t
        } else {
            text
        };
        merge(out, self.inner.push(text));
    }

    fn run(&mut self, out: &mut Parsed) {
        loop {
            match self.state {
                State::Start => match opening(&self.buf, &[OPEN]) {
                    Opening::Opens { whitespace } => {
                        self.buf.drain(..whitespace + OPEN.len());
                        self.state = State::Reasoning;
                    }
                    Opening::Undecided => return,
                    Opening::Not => self.state = State::After,
                },
                State::Reasoning => match scan(&self.buf, &[CLOSE]) {
                    Scan::Found { at, .. } => {
                        self.reasoning.text(&self.buf[..at], &mut out.reasoning);
                        self.reasoning.call_boundary();
                        self.buf.drain(..at + CLOSE.len());
                        self.state = State::After;
                        self.trim_content = true;
                    }
                    Scan::Text { safe } => {
                        self.reasoning.text(&self.buf[..safe], &mut out.reasoning);
                        self.buf.drain(..safe);
                        return;
                    }
                },
                State::After => {
                    let rest = std::mem::take(&mut self.buf);
                    self.feed_inner(&rest, out);
                    return;
                }
            }
        }
    }
}

fn merge(out: &mut Parsed, p: Parsed) {
    out.content.push_str(&p.content);
    out.reasoning.push_str(&p.reasoning);
    out.calls.extend(p.calls);
}

impl OutputParser for Think {
    fn push(&mut self, text: &str) -> Parsed {
        let mut out = Parsed::default();
        self.buf.push_str(text);
        self.run(&mut out);
        out
    }

    fn finish(&mut self) -> Parsed {
        let mut out = Parsed::default();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Reasoning => {
                self.reasoning.text(&rest, &mut out.reasoning);
                self.reasoning.finish(&mut out.reasoning);
            }
            _ => self.feed_inner(&rest, &mut out),
        }
        merge(&mut out, self.inner.finish());
        self.state = State::After;
        out
    }

    fn stream_calls(&mut self, declared: Option<std::sync::Arc<std::collections::HashSet<String>>>) {
        self.inner.stream_calls(declared);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{assert_linear, call, expect, long_plain_text_streams, parse_all_splits};
    use super::super::{hermes, OutputParser, PassThrough};
    use super::Think;

    fn plain() -> Box<dyn OutputParser> {
        Box::new(Think::new(Box::new(PassThrough), false))
    }
    fn opened() -> Box<dyn OutputParser> {
        Box::new(Think::new(Box::new(PassThrough), true))
    }
    fn with_tools() -> Box<dyn OutputParser> {
        Box::new(Think::new(hermes::parser(), false))
    }

    #[test]
    fn reasoning_then_content() {
        let text = "<think>\nThe user greets.\n</think>\n\nHello!";
        assert_eq!(
            parse_all_splits(&plain, text),
            expect("Hello!", "The user greets.", &[])
        );
    }

    #[test]
    fn prompt_opened_think_block() {
        // DeepSeek R1's template ends the prompt with "<think>\n": the output starts inside the reasoning.
        let text = "Let me think: 2+2.\n</think>\n\n4";
        assert_eq!(parse_all_splits(&opened, text), expect("4", "Let me think: 2+2.", &[]));
        let cut = "still thinking <";
        assert_eq!(parse_all_splits(&opened, cut), expect("", "still thinking <", &[]));
    }

    #[test]
    fn no_think_block_is_all_content() {
        let text = "  Just an answer </think> with a stray tag.";
        assert_eq!(parse_all_splits(&plain, text), expect(text, "", &[]));
        let lookalike = "<thin";
        assert_eq!(parse_all_splits(&plain, lookalike), expect(lookalike, "", &[]));
        long_plain_text_streams(&plain);
    }

    #[test]
    fn truncated_reasoning_is_reasoning() {
        let text = "<think>\nhmm, wait </thi";
        assert_eq!(parse_all_splits(&plain, text), expect("", "hmm, wait </thi", &[]));
    }

    #[test]
    fn qwen3_thinks_then_calls_a_tool() {
        // Qwen3's rendering of an assistant turn with reasoning and a call.
        let text = "<think>\nNeed weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let got = parse_all_splits(&with_tools, text);
        assert_eq!(
            got,
            expect("", "Need weather.", &[call("get_weather", r#"{"city":"Paris"}"#)])
        );
        // Markup in the reasoning is reasoning, not a call.
        let text = "<think>maybe <tool_call>{\"name\": \"x\"}</tool_call></think>ok";
        let got = parse_all_splits(&with_tools, text);
        assert_eq!(got, expect("ok", "maybe <tool_call>{\"name\": \"x\"}</tool_call>", &[]));
    }
    #[test]
    fn linear_in_the_output_length() {
        assert_linear(&with_tools, "", "");
        assert_linear(&with_tools, "<think>", "</think>");
    }
}
