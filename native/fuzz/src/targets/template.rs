//! The chat template renderer: the project's test templates (tests/templates/) applied to fuzzed chat
//! requests, both as the request parser passes them on and raw (messages the parser would refuse, a
//! named field to continue), and rendered with the raw request as the whole context. Rendering may refuse
//! an input; it must not panic.

use std::sync::OnceLock;

use extproc_core::openai::request::parse_chat_request;
use extproc_core::template::{ChatInputs, ChatTemplate, RenderError};
use serde_json::{json, Map, Value};

use super::{signature, Target};
use crate::json_gen;
use crate::rng::Rng;

pub const TARGET: Target = Target {
    name: "template",
    run,
    generate,
    mutate,
    dictionary,
};

/// The test templates, compiled once.
const SOURCES: [(&str, &str); 18] = [
    ("deepseek", include_str!("../../../../tests/templates/deepseek.jinja")),
    ("documents", include_str!("../../../../tests/templates/documents.jinja")),
    ("parts", include_str!("../../../../tests/templates/parts.jinja")),
    (
        "python_compat",
        include_str!("../../../../tests/templates/python_compat.jinja"),
    ),
    ("reasoning", include_str!("../../../../tests/templates/reasoning.jinja")),
    ("tools", include_str!("../../../../tests/templates/tools.jinja")),
    ("turns", include_str!("../../../../tests/templates/turns.jinja")),
    (
        "hermes_qwen25",
        include_str!("../../../../tests/templates/hermes_qwen25.jinja"),
    ),
    ("qwen3", include_str!("../../../../tests/templates/qwen3.jinja")),
    (
        "qwen3_coder",
        include_str!("../../../../tests/templates/qwen3_coder.jinja"),
    ),
    (
        "llama31_json",
        include_str!("../../../../tests/templates/llama31_json.jinja"),
    ),
    (
        "llama4_pythonic",
        include_str!("../../../../tests/templates/llama4_pythonic.jinja"),
    ),
    ("mistral", include_str!("../../../../tests/templates/mistral.jinja")),
    (
        "deepseek_r1",
        include_str!("../../../../tests/templates/deepseek_r1.jinja"),
    ),
    ("kimi_k2", include_str!("../../../../tests/templates/kimi_k2.jinja")),
    ("glm45", include_str!("../../../../tests/templates/glm45.jinja")),
    (
        "gpt_oss_harmony",
        include_str!("../../../../tests/templates/gpt_oss_harmony.jinja"),
    ),
    ("nemotron", include_str!("../../../../tests/templates/nemotron.jinja")),
];

fn templates() -> &'static [ChatTemplate] {
    static TEMPLATES: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        SOURCES
            .iter()
            .map(|(name, source)| ChatTemplate::compile(source).unwrap_or_else(|e| panic!("test template {name}: {e}")))
            .collect()
    })
}

fn special_tokens() -> &'static Map<String, Value> {
    static TOKENS: OnceLock<Map<String, Value>> = OnceLock::new();
    TOKENS.get_or_init(|| {
        let tokens = json!({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"});
        tokens.as_object().expect("object").clone()
    })
}

fn outcome(result: Result<String, RenderError>) -> String {
    match result {
        Ok(text) => format!("ok:{}", text.len().min(1)),
        Err(RenderError::Raised(m)) => format!("raised:{m}"),
        Err(RenderError::Invalid { param, message }) => format!("invalid:{param}:{message}"),
        Err(RenderError::Failed(m)) => format!("failed:{m}"),
    }
}

fn run(data: &[u8]) -> u64 {
    let Ok(Value::Object(raw)) = serde_json::from_slice::<Value>(data) else {
        return 0;
    };
    let mut outcomes = Vec::new();
    if let Ok(request) = parse_chat_request(data) {
        let chat = request.chat().expect("a chat request");
        let inputs = ChatInputs {
            messages: &chat.messages,
            tools: chat.tools.as_ref(),
            documents: None,
            add_generation_prompt: chat.add_generation_prompt,
            continue_final_message: chat.continue_final_message.then_some("content"),
            special_tokens: Some(special_tokens()),
            kwargs: Some(&chat.chat_template_kwargs),
        };
        outcomes.extend(templates().iter().map(|t| outcome(t.apply(&inputs))));
    }
    if let Some(Value::Array(messages)) = raw.get("messages") {
        let inputs = ChatInputs {
            messages,
            tools: raw.get("tools"),
            documents: raw.get("documents"),
            add_generation_prompt: raw
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            continue_final_message: raw.get("continue_final_message").and_then(Value::as_str),
            special_tokens: Some(special_tokens()),
            kwargs: raw.get("chat_template_kwargs").and_then(Value::as_object),
        };
        outcomes.extend(templates().iter().map(|t| outcome(t.apply(&inputs))));
    }
    let context = Value::Object(raw);
    outcomes.extend(templates().iter().map(|t| outcome(t.render_json(&context))));
    signature(&outcomes.join("|"))
}

fn generate(rng: &mut Rng) -> Vec<u8> {
    let mut request = json_gen::request(rng, true);
    if rng.one_in(4) {
        let field = *rng.pick(&["content", "reasoning_content", "thinking", "reasoning", "nope"]);
        request["continue_final_message"] = Value::from(field);
        request["add_generation_prompt"] = Value::Bool(false);
    }
    if rng.one_in(4) {
        request["documents"] = json_gen::field_value(rng, "documents");
    }
    serde_json::to_vec(&request).expect("JSON")
}

fn mutate(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    (super::request::TARGET.mutate)(rng, data)
}

fn dictionary() -> Vec<&'static [u8]> {
    let mut tokens = json_gen::field_tokens();
    tokens.extend([
        &b"\"tool_calls\""[..],
        b"\"reasoning_content\"",
        b"\"documents\"",
        b"\"function\"",
        b"\"arguments\"",
        b"{{",
        b"}}",
        b"{%",
    ]);
    tokens
}
