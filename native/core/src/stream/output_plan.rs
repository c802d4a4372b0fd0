//! Which parsers a model's chat answers go through, and, per request, whether they do.
//!
//! A model's tool-call and reasoning formats come from its settings (`tool_parser`, `reasoning_parser`:
//! a format name, `none`, or `auto`) and otherwise from what its name and chat template look like
//! (`agent::infer`). A request's choices are parsed when it is a chat request and the model has a tool
//! format (and the request has tools and a `tool_choice` other than none) or a reasoning format (unless
//! `chat_template_kwargs` turns thinking off). A forced `tool_choice` (required or named) made the engine
//! write JSON calls: those are read by `ForcedCallsParser`, after the reasoning parser if any.
//!
//! Special tokens: several formats mark calls or reasoning with special tokens that
//! `skip_special_tokens` would drop (`<|python_tag|>`, DeepSeek's `<｜tool▁calls▁begin｜>`, Harmony's
//! `<|channel|>`...). Parsed text keeps the special tokens that are markers of some format
//! (`PARSER_MARKERS`) and drops every other special token (EOS, headers), so the content is what it
//! would have been.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use crate::agent as formats;
use crate::agent::{OutputParser, Parsed};
use crate::gateway::ServedModel;
use crate::model::ModelFiles;
use crate::openai::request::{Api, GenerationRequest, PromptInput, ToolChoice};
use crate::stream::forced_calls::ForcedCallsParser;

pub use crate::agent::{ReasoningFormat, ToolFormat};

/// The formats' markers that are special tokens in some tokenizer: kept in parsed text.
pub const PARSER_MARKERS: &[&str] = &[
    // Llama 3.x
    "<|python_tag|>",
    // Reasoning
    "<think>",
    "</think>",
    // Hermes / Qwen / GLM
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    // Mistral
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "[THINK]",
    "[/THINK]",
    // DeepSeek V3 / R1
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    // Kimi K2
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    // gpt-oss Harmony
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|call|>",
];

/// How a model's setting names a parser: `auto` (or absent) infers it, `none` turns it off.
fn setting<T>(value: Option<&str>, inferred: Option<T>) -> Result<Option<T>, String>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(inferred),
        Some("none") => Ok(None),
        Some(name) => name.parse().map(Some).map_err(|e| format!("{e}, none, auto")),
    }
}

/// A served model's parsers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelParsers {
    pub tool: Option<ToolFormat>,
    pub reasoning: Option<ReasoningFormat>,
}

impl ModelParsers {
    /// The parsers of the model `name` with these files: as set (`tool_parser`, `reasoning_parser`), else
    /// inferred from the name and the chat template.
    pub fn resolve(
        name: &str,
        files: &ModelFiles,
        tool_parser: Option<&str>,
        reasoning_parser: Option<&str>,
    ) -> Result<Self, String> {
        let template = files.template.as_ref().map(|t| t.source()).unwrap_or_default();
        let (tool, reasoning) = formats::infer(name, template);
        let tool = setting(tool_parser, tool)?;
        let reasoning = setting(reasoning_parser, reasoning)?;
        Ok(ModelParsers { tool, reasoning })
    }
}

/// Every special token of the vocabulary (one that `skip_special_tokens` drops) that is not a marker:
/// what parsed text drops.
pub fn non_marker_special_ids(files: &ModelFiles) -> HashSet<u32> {
    let tokenizer = &files.tokenizer;
    let markers: HashSet<u32> = PARSER_MARKERS.iter().filter_map(|m| tokenizer.token_to_id(m)).collect();
    (0..tokenizer.vocab_size() as u32)
        .filter(|id| !markers.contains(id))
        .filter(|&id| tokenizer.decode(&[id], true).is_empty() && !tokenizer.decode(&[id], false).is_empty())
        .collect()
}

/// How one request's choices are parsed.
pub struct ParsingPlan {
    tool: Option<ToolFormat>,
    reasoning: Option<ReasoningFormat>,
    forced: bool,
    prompt_opens_think: bool,
    dropped: Arc<HashSet<u32>>,
    /// The message says `reasoning_content` (null when none).
    pub reasoning_parsed: bool,
    /// The names of the request's tools: a stream sends a call's name early only when it is one of them.
    declared: Arc<HashSet<String>>,
    /// `include_reasoning` (vLLM, default true): false parses reasoning out and leaves it out of the answer.
    pub include_reasoning: bool,
}

impl ParsingPlan {
    /// A new parser for one choice.
    pub fn parser(&self) -> Box<dyn OutputParser> {
        if !self.forced {
            return formats::parser(self.tool, self.reasoning, self.prompt_opens_think);
        }
        let calls: Box<dyn OutputParser> = Box::new(ForcedCallsParser::new());
        match self.reasoning {
            Some(reasoning) => Box::new(Chained {
                first: formats::parser(None, Some(reasoning), self.prompt_opens_think),
                second: calls,
            }),
            None => calls,
        }
    }

    /// A new parser for one choice of a stream (`stream`) or of a whole answer.
    pub fn parser_for(&self, stream: bool) -> Box<dyn OutputParser> {
        let mut parser = self.parser();
        if stream {
            parser.stream_calls(Some(self.declared.clone()));
        }
        parser
    }

    /// The special token ids to drop before decoding, unless the client asked to keep them all.
    pub fn dropped_ids(&self, skip_special_tokens: bool) -> Option<&HashSet<u32>> {
        (skip_special_tokens && !self.dropped.is_empty()).then_some(&*self.dropped)
    }
}

/// A parsing plan as data: what the response plan (`response_plan.rs`) carries to another host of the
/// response side, which rebuilds the plan with the model's own dropped special tokens.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParsingSpec {
    pub tool: Option<String>,
    pub reasoning: Option<String>,
    pub forced: bool,
    pub prompt_opens_think: bool,
    pub reasoning_parsed: bool,
    /// The request's tool names (a stream sends a call's name early only for these).
    #[serde(default)]
    pub declared: Vec<String>,
    #[serde(default = "include_reasoning_default")]
    pub include_reasoning: bool,
}

fn include_reasoning_default() -> bool {
    true
}

impl ParsingPlan {
    pub fn spec(&self) -> ParsingSpec {
        ParsingSpec {
            tool: self.tool.map(|t| t.to_string()),
            reasoning: self.reasoning.map(|r| r.to_string()),
            forced: self.forced,
            prompt_opens_think: self.prompt_opens_think,
            reasoning_parsed: self.reasoning_parsed,
            declared: self.declared.iter().cloned().collect(),
            include_reasoning: self.include_reasoning,
        }
    }
}

impl ParsingSpec {
    /// The plan again; `dropped` is the model's `non_marker_special_ids`.
    pub fn plan(&self, dropped: Arc<HashSet<u32>>) -> Result<ParsingPlan, String> {
        let tool = self.tool.as_deref().map(str::parse::<ToolFormat>).transpose();
        let reasoning = self.reasoning.as_deref().map(str::parse::<ReasoningFormat>).transpose();
        Ok(ParsingPlan {
            tool: tool.map_err(|e| e.to_string())?,
            reasoning: reasoning.map_err(|e| e.to_string())?,
            forced: self.forced,
            prompt_opens_think: self.prompt_opens_think,
            dropped,
            reasoning_parsed: self.reasoning_parsed,
            declared: Arc::new(self.declared.iter().cloned().collect()),
            include_reasoning: self.include_reasoning,
        })
    }
}

/// Whether `thinking` is off for this chat (`chat_template_kwargs`: `enable_thinking` as Qwen3's
/// templates name it, `thinking` as DeepSeek V3.1's).
fn thinking_off(kwargs: &serde_json::Map<String, Value>) -> bool {
    ["enable_thinking", "thinking"]
        .iter()
        .any(|k| kwargs.get(*k) == Some(&Value::Bool(false)))
}

pub use crate::agent::prompt_opens_think;

/// The plan for `request` to `model`; `opens_think`: its rendered chat ends inside a think block. None:
/// not a chat request, or nothing to parse.
pub fn plan(model: &ServedModel, request: &GenerationRequest, opens_think: bool) -> Option<ParsingPlan> {
    let parsers = model.parsers();
    let PromptInput::Chat(chat) = &request.input else {
        return None;
    };
    if request.api != Api::Chat {
        return None;
    }
    let has_tools = chat
        .tools
        .as_ref()
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let forced = has_tools && request.tool_choice.is_forced();
    let tool = parsers
        .tool
        .filter(|_| has_tools && !forced && request.tool_choice != ToolChoice::None);
    let reasoning = parsers.reasoning.filter(|_| !thinking_off(&chat.chat_template_kwargs));
    if tool.is_none() && reasoning.is_none() && !forced {
        return None;
    }
    Some(ParsingPlan {
        tool,
        reasoning,
        forced,
        prompt_opens_think: opens_think,
        dropped: model.non_marker_special_ids(),
        reasoning_parsed: reasoning.is_some(),
        declared: Arc::new(tool_names(chat.tools.as_ref())),
        include_reasoning: chat.include_reasoning,
    })
}

/// The `function.name` of each tool.
fn tool_names(tools: Option<&Value>) -> HashSet<String> {
    let tools = tools.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// Two parsers in a row: the first's content is the second's input; reasoning and calls of both pass.
struct Chained {
    first: Box<dyn OutputParser>,
    second: Box<dyn OutputParser>,
}

impl Chained {
    fn then(&mut self, first: Parsed, end: bool) -> Parsed {
        let mut second = self.second.push(&first.content);
        if end {
            let rest = self.second.finish();
            second.content.push_str(&rest.content);
            second.reasoning.push_str(&rest.reasoning);
            second.calls.extend(rest.calls);
        }
        let mut reasoning = first.reasoning;
        reasoning.push_str(&second.reasoning);
        let mut calls = first.calls;
        calls.extend(second.calls);
        Parsed {
            content: second.content,
            reasoning,
            calls,
        }
    }
}

impl OutputParser for Chained {
    fn push(&mut self, text: &str) -> Parsed {
        let first = self.first.push(text);
        self.then(first, false)
    }

    fn finish(&mut self) -> Parsed {
        let first = self.first.finish();
        self.then(first, true)
    }

    fn stream_calls(&mut self, declared: Option<Arc<HashSet<String>>>) {
        self.first.stream_calls(declared.clone());
        self.second.stream_calls(declared);
    }
}
