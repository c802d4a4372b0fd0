//! Which parser a model gets: the formats by configuration name (`tool_parser` / `reasoning_parser` model
//! settings), the parser they make, and the formats inferred from the model's name and chat template when
//! the configuration names none. The table is in docs/agents.md.

use std::fmt;
use std::str::FromStr;

use super::{deepseek, glm45, harmony, hermes, kimi_k2, llama3, mistral, pythonic, qwen3_coder};
use super::{OutputParser, PassThrough, Think};

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Qwen3Coder,
    Llama3Json,
    Pythonic,
    Mistral,
    DeepSeekV3,
    KimiK2,
    Glm45,
    Harmony,
}

/// How a model writes its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>...</think>`.
    Think,
    /// gpt-oss's analysis channel.
    Harmony,
}

/// (canonical name, other accepted names) per format.
const TOOL_NAMES: [(ToolFormat, &str, &[&str]); 9] = [
    (ToolFormat::Hermes, "hermes", &["qwen", "qwen25", "qwen2_5", "qwen3"]),
    (ToolFormat::Qwen3Coder, "qwen3_coder", &["qwen3_xml"]),
    (ToolFormat::Llama3Json, "llama3_json", &["llama3", "llama"]),
    (ToolFormat::Pythonic, "pythonic", &["llama4_pythonic", "llama4"]),
    (ToolFormat::Mistral, "mistral", &[]),
    (
        ToolFormat::DeepSeekV3,
        "deepseek_v3",
        &["deepseek", "deepseek_r1", "deepseek_v31"],
    ),
    (ToolFormat::KimiK2, "kimi_k2", &["kimi"]),
    (ToolFormat::Glm45, "glm45", &["glm4_moe", "glm46", "glm"]),
    (ToolFormat::Harmony, "harmony", &["openai", "gpt_oss"]),
];

const REASONING_NAMES: [(ReasoningFormat, &str, &[&str]); 2] = [
    (
        ReasoningFormat::Think,
        "think",
        &["deepseek_r1", "qwen3", "glm45", "kimi_k2"],
    ),
    (ReasoningFormat::Harmony, "harmony", &["openai", "gpt_oss"]),
];

/// A name that is not a known format (the message lists the known ones).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {name:?}; known: {known}")]
pub struct UnknownFormat {
    kind: &'static str,
    name: String,
    known: String,
}

fn lookup<T: Copy>(table: &[(T, &str, &[&str])], kind: &'static str, name: &str) -> Result<T, UnknownFormat> {
    let wanted = name.trim().to_ascii_lowercase().replace(['-', '.'], "_");
    table
        .iter()
        .find(|(_, canonical, aliases)| *canonical == wanted || aliases.contains(&wanted.as_str()))
        .map(|(format, _, _)| *format)
        .ok_or_else(|| UnknownFormat {
            kind,
            name: name.to_string(),
            known: table.iter().map(|(_, n, _)| *n).collect::<Vec<_>>().join(", "),
        })
}

impl FromStr for ToolFormat {
    type Err = UnknownFormat;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        lookup(&TOOL_NAMES, "tool_parser", name)
    }
}

impl FromStr for ReasoningFormat {
    type Err = UnknownFormat;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        lookup(&REASONING_NAMES, "reasoning_parser", name)
    }
}

impl fmt::Display for ToolFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = TOOL_NAMES.iter().find(|(t, _, _)| t == self).map_or("?", |(_, n, _)| n);
        f.write_str(name)
    }
}

impl fmt::Display for ReasoningFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = REASONING_NAMES
            .iter()
            .find(|(t, _, _)| t == self)
            .map_or("?", |(_, n, _)| n);
        f.write_str(name)
    }
}

/// The parser of one choice's output. Harmony (as either format) is one parser for both reasoning and calls;
/// `<think>` reasoning wraps the tool parser, which then sees only the text after the reasoning.
/// `prompt_opens_think`: the rendered prompt already opened the think block (see [`prompt_opens_think`]).
pub fn parser(
    tool: Option<ToolFormat>,
    reasoning: Option<ReasoningFormat>,
    prompt_opens_think: bool,
) -> Box<dyn OutputParser> {
    if tool == Some(ToolFormat::Harmony) || reasoning == Some(ReasoningFormat::Harmony) {
        return harmony::parser();
    }
    let calls: Box<dyn OutputParser> = match tool {
        None => Box::new(PassThrough),
        Some(ToolFormat::Hermes) => hermes::parser(),
        Some(ToolFormat::Qwen3Coder) => qwen3_coder::parser(),
        Some(ToolFormat::Llama3Json) => llama3::parser(),
        Some(ToolFormat::Pythonic) => pythonic::parser(),
        Some(ToolFormat::Mistral) => mistral::parser(),
        Some(ToolFormat::DeepSeekV3) => deepseek::parser(),
        Some(ToolFormat::KimiK2) => kimi_k2::parser(),
        Some(ToolFormat::Glm45) => glm45::parser(),
        Some(ToolFormat::Harmony) => unreachable!("handled above"),
    };
    match reasoning {
        Some(ReasoningFormat::Think) => Box::new(Think::new(calls, prompt_opens_think)),
        _ => calls,
    }
}

/// Whether a rendered prompt leaves the model inside a think block (it ends with `<think>`, as DeepSeek R1's
/// and some Qwen3 / GLM templates do), so the output starts with reasoning and has no `<think>` of its own.
pub fn prompt_opens_think(prompt: &str) -> bool {
    prompt.trim_end().ends_with("<think>")
}

/// The formats a model most likely uses, from markers in its chat template first (they name the exact
/// syntax), then its name. `<think>` reasoning is inferred when the template mentions `<think>` or the name
/// is of a reasoning family. See docs/agents.md for the table.
pub fn infer(model_name: &str, chat_template: &str) -> (Option<ToolFormat>, Option<ReasoningFormat>) {
    let name = model_name.to_ascii_lowercase();
    let has = |marker: &str| chat_template.contains(marker);
    let named = |parts: &[&str]| parts.iter().any(|p| name.contains(p));
    if has("<|channel|>") && has("<|message|>") || named(&["gpt-oss", "gpt_oss"]) {
        return (Some(ToolFormat::Harmony), Some(ReasoningFormat::Harmony));
    }
    let tool = if named(&["llama-4", "llama4", "llama_4"]) {
        Some(ToolFormat::Pythonic)
    } else if has(deepseek::CALLS_BEGIN) {
        Some(ToolFormat::DeepSeekV3)
    } else if has(kimi_k2::SECTION_BEGIN) {
        Some(ToolFormat::KimiK2)
    } else if has("<arg_key>") {
        Some(ToolFormat::Glm45)
    } else if has("<function=") && has("<parameter=") {
        Some(ToolFormat::Qwen3Coder)
    } else if has("<tool_call>") {
        Some(ToolFormat::Hermes)
    } else if has("[TOOL_CALLS]") {
        Some(ToolFormat::Mistral)
    } else if has("<|python_tag|>") {
        Some(ToolFormat::Llama3Json)
    } else if named(&["deepseek"]) {
        Some(ToolFormat::DeepSeekV3)
    } else if named(&["kimi-k2", "kimi_k2"]) {
        Some(ToolFormat::KimiK2)
    } else if named(&["glm-4.5", "glm-4.6", "glm-4.7", "glm4.5", "glm4.6", "glm-4-moe"]) {
        Some(ToolFormat::Glm45)
    } else if named(&["qwen3-coder", "qwen3_coder"]) {
        Some(ToolFormat::Qwen3Coder)
    } else if named(&["qwen", "qwq", "hermes"]) {
        Some(ToolFormat::Hermes)
    } else if named(&["mistral", "mixtral", "ministral", "devstral", "magistral", "codestral"]) {
        Some(ToolFormat::Mistral)
    } else if named(&["llama-3", "llama3", "llama_3"]) {
        Some(ToolFormat::Llama3Json)
    } else {
        None
    };
    let thinks_by_name = named(&[
        "deepseek-r1",
        "deepseek_r1",
        "qwq",
        "qwen3",
        "glm-4.5",
        "glm-4.6",
        "glm-4.7",
        "kimi-k2-thinking",
    ]) && !named(&["qwen3-coder", "instruct-2507", "-instruct"]);
    let reasoning = (has("<think>") || thinks_by_name).then_some(ReasoningFormat::Think);
    (tool, reasoning)
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{call, expect, parse_all_splits};
    use super::{infer, parser, prompt_opens_think, ReasoningFormat as R, ToolFormat as T};

    #[test]
    fn names_round_trip_and_aliases() {
        for (format, name, aliases) in super::TOOL_NAMES {
            assert_eq!(name.parse::<T>(), Ok(format));
            assert_eq!(format.to_string(), name);
            for alias in aliases {
                assert_eq!(alias.parse::<T>(), Ok(format));
            }
        }
        assert_eq!("Qwen3-Coder".parse::<T>(), Ok(T::Qwen3Coder));
        assert_eq!("think".parse::<R>(), Ok(R::Think));
        assert_eq!("harmony".parse::<R>(), Ok(R::Harmony));
        let err = "nope".parse::<T>().unwrap_err().to_string();
        assert!(
            err.contains("unknown tool_parser \"nope\"") && err.contains("hermes, qwen3_coder"),
            "{err}"
        );
    }

    #[test]
    fn inference_from_names_and_templates() {
        type Case = (&'static str, &'static str, (Option<T>, Option<R>));
        let cases: [Case; 14] = [
            ("openai/gpt-oss-20b", "", (Some(T::Harmony), Some(R::Harmony))),
            (
                "x",
                "{{ '<|start|>assistant<|channel|>final<|message|>' }}",
                (Some(T::Harmony), Some(R::Harmony)),
            ),
            (
                "Qwen/Qwen2.5-7B-Instruct",
                "<tool_call>\n{{ tool_call | tojson }}",
                (Some(T::Hermes), None),
            ),
            (
                "Qwen/Qwen3-8B",
                "<tool_call> <think>",
                (Some(T::Hermes), Some(R::Think)),
            ),
            (
                "Qwen/Qwen3-Coder-30B-A3B-Instruct",
                "<tool_call><function=x><parameter=y>",
                (Some(T::Qwen3Coder), None),
            ),
            (
                "meta-llama/Llama-3.1-8B-Instruct",
                "<|python_tag|>",
                (Some(T::Llama3Json), None),
            ),
            (
                "meta-llama/Llama-4-Scout-17B-16E-Instruct",
                "<|python_tag|>",
                (Some(T::Pythonic), None),
            ),
            (
                "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
                "",
                (Some(T::Mistral), None),
            ),
            (
                "deepseek-ai/DeepSeek-R1",
                "<｜tool▁calls▁begin｜>",
                (Some(T::DeepSeekV3), Some(R::Think)),
            ),
            (
                "deepseek-ai/DeepSeek-V3",
                "<｜tool▁calls▁begin｜>",
                (Some(T::DeepSeekV3), None),
            ),
            (
                "moonshotai/Kimi-K2-Instruct",
                "<|tool_calls_section_begin|>",
                (Some(T::KimiK2), None),
            ),
            ("zai-org/GLM-4.6", "<arg_key>", (Some(T::Glm45), Some(R::Think))),
            ("my-org/custom", "{{ messages }}", (None, None)),
            (
                "NousResearch/Hermes-3-Llama-3.1-8B",
                "<tool_call>",
                (Some(T::Hermes), None),
            ),
        ];
        for (name, template, want) in cases {
            assert_eq!(infer(name, template), want, "{name}");
        }
    }

    #[test]
    fn parser_composes_reasoning_and_calls() {
        let make = || parser(Some(T::Hermes), Some(R::Think), true);
        let text = "Need a call.</think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            parse_all_splits(&make, text),
            expect("", "Need a call.", &[call("f", "{}")])
        );
        let none = || parser(None, None, false);
        let text = "<tool_call>{\"name\": \"f\"}</tool_call> <think>x</think>";
        assert_eq!(parse_all_splits(&none, text), expect(text, "", &[]));
        let harmony = || parser(None, Some(R::Harmony), false);
        let text = "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>final<|message|>c<|return|>";
        assert_eq!(parse_all_splits(&harmony, text), expect("c", "r", &[]));
        assert!(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
}
