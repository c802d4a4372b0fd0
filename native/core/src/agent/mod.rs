//! Model output → the parts of an OpenAI message: reasoning, content and tool calls, parsed incrementally
//! from the decoded text of one choice as it streams.
//!
//! A parser is fed the choice's text delta by delta (special tokens kept where the format marks calls or
//! reasoning with them) and returns only what is certain: text that may still turn out to be the start of a
//! call or reasoning marker is held back until the next delta or `finish`. Concatenating everything a parser
//! returns, delta by delta, gives the same result however the text was split.
//!
//! By default the tool-call parsers announce a call only once it is complete and valid, as one piece carrying
//! its name and whole arguments, so a truncated or malformed call is content (a whole answer). A stream turns
//! on `stream_calls`: every format then sends a call's name as soon as it is certain (and declared) and its
//! arguments as they arrive, fragments that concatenate to the whole answer's arguments (`tagged.rs` for
//! the formats with markers around each call, `sent_call.rs` for the others' bookkeeping). Reasoning and
//! content stream as they arrive. Families, names and inference: docs/agents.md; the stream shapes:
//! docs/agent-responses.md.

use std::collections::HashSet;
use std::sync::Arc;

/// One piece of a tool call as it streams. A call's first piece carries its name; every piece may carry
/// argument text. A call's `arguments` pieces concatenated are its arguments as a JSON object string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallPiece {
    /// The call's position among this choice's calls (0, 1, ...).
    pub index: u32,
    pub name: Option<String>,
    /// The call id the model wrote (Kimi K2's `functions.NAME:IDX`), on the first piece; else the answer
    /// makes a `call_` id.
    pub id: Option<String>,
    pub arguments: String,
}

/// What one delta (or the end) of a choice's text said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text for the message's `content`.
    pub content: String,
    /// Text for the message's `reasoning_content`.
    pub reasoning: String,
    pub calls: Vec<ToolCallPiece>,
}

impl Parsed {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }
}

/// An incremental parser of one choice's output.
pub trait OutputParser: Send {
    /// The next decoded text of the choice.
    fn push(&mut self, text: &str) -> Parsed;
    /// The choice has ended: whatever was held back. A call left malformed or truncated comes back as
    /// content (never dropped, never a crash).
    fn finish(&mut self) -> Parsed;
    /// This choice streams: send each call's name as soon as it is certain (when `declared` is given, only
    /// a declared tool's name; others go whole when they close) and its arguments as they arrive. Called
    /// before the first push; formats without a call reader ignore it.
    fn stream_calls(&mut self, declared: Option<Arc<HashSet<String>>>) {
        let _ = declared;
    }
}

mod deepseek;
mod glm45;
mod harmony;
mod hermes;
pub(crate) mod json_call;
mod kimi_k2;
mod llama3;
mod mistral;
mod pythonic;
mod qwen3_coder;
mod scan;
mod select;
pub(crate) mod sent_call;
mod tagged;
#[cfg(test)]
mod template_roundtrip_tests;
#[cfg(test)]
pub(crate) mod testutil;
mod think;

pub use select::{infer, parser, prompt_opens_think, ReasoningFormat, ToolFormat};
pub use think::Think;

/// The parser for a choice with neither tool calls nor reasoning to find: all text is content.
pub struct PassThrough;

impl OutputParser for PassThrough {
    fn push(&mut self, text: &str) -> Parsed {
        Parsed {
            content: text.to_string(),
            ..Parsed::default()
        }
    }

    fn finish(&mut self) -> Parsed {
        Parsed::default()
    }
}
