//! Each family's parser reads back the tool calls its own chat template writes: the assistant turn a
//! template renders for a conversation with calls (the text a model of that family is trained to emit) is
//! cut out of the prompt and parsed as model output. A parser whose markers drift from the template's fails
//! here, whatever its own samples say.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::select::{infer, parser, ToolFormat};
use super::testutil::parse_all_splits;
use crate::template::{ChatInputs, ChatTemplate};

/// The project's family templates (tests/templates at the repository root).
fn template(file: &str) -> ChatTemplate {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/templates")
        .join(file);
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ChatTemplate::compile(&source).unwrap()
}

fn render(t: &ChatTemplate, messages: &[Value], tools: &Value, add_generation_prompt: bool, eos: &str) -> String {
    let kwargs = json!({"date_string": "26 Jul 2024", "bos_token": "<s>", "eos_token": eos});
    t.apply(&ChatInputs {
        kwargs: kwargs.as_object(),
        messages,
        tools: Some(tools),
        add_generation_prompt,
        ..ChatInputs::default()
    })
    .unwrap_or_else(|e| panic!("{e:?}"))
}

/// What the model said in the final assistant turn: the conversation rendered with that turn, less the
/// conversation rendered up to the generation prompt, less the end-of-turn marker (the engine stops on it,
/// it never reaches the parser).
fn assistant_turn(
    t: &ChatTemplate,
    calls: &[(&str, Value)],
    end_of_turn: &[&str],
    ids: &dyn Fn(usize, &str) -> String,
) -> String {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let user = json!({"role": "user", "content": "Weather in Paris and Rome?"});
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": ids(i, name), "type": "function",
                   "function": {"name": name, "arguments": args}})
        })
        .collect();
    let assistant = json!({"role": "assistant", "content": "", "tool_calls": tool_calls});
    let eos = end_of_turn.first().copied().unwrap_or("");
    let prompt = render(t, std::slice::from_ref(&user), &tools, true, eos);
    let whole = render(t, &[user, assistant], &tools, false, eos);
    // A generation prompt that opens a think block (DeepSeek R1) is not in the rendered history, which
    // drops reasoning: the calls follow the prompt without it (the model closes its reasoning first).
    let prompt = match prompt.trim_end().strip_suffix("<think>") {
        Some(opened) if !whole.starts_with(&prompt) => opened.to_string(),
        _ => prompt,
    };
    let turn = whole
        .strip_prefix(&prompt)
        .unwrap_or_else(|| panic!("the prompt is not a prefix of the conversation:\n{prompt}\n---\n{whole}"));
    let mut turn = turn.trim_end().to_string();
    for end in end_of_turn {
        if let Some(cut) = turn.strip_suffix(end) {
            turn = cut.trim_end().to_string();
        }
    }
    turn
}

#[test]
fn every_family_parser_reads_back_the_calls_its_template_writes() {
    let paris = json!({"city": "Paris"});
    let rome = json!({"city": "Rome"});
    let two = [("get_weather", paris.clone()), ("get_weather", rome.clone())];
    let one = [("get_weather", paris.clone())];
    // Mistral's template wants 9-character ids; Kimi K2 names each call by its id, `functions.NAME:INDEX`.
    let nine = |i: usize, _: &str| format!("call{i:04}x");
    let kimi = |i: usize, name: &str| format!("functions.{name}:{i}");
    // (template, a model name, the format they imply, calls it may render, the end-of-turn markers, ids)
    type Family<'a> = (
        &'a str,
        &'a str,
        ToolFormat,
        &'a [(&'a str, Value)],
        &'a [&'a str],
        &'a dyn Fn(usize, &str) -> String,
    );
    let families: [Family; 9] = [
        (
            "hermes_qwen25.jinja",
            "Qwen2.5-7B-Instruct",
            ToolFormat::Hermes,
            &two,
            &["<|im_end|>"],
            &nine,
        ),
        (
            "qwen3_coder.jinja",
            "Qwen3-Coder-30B-A3B-Instruct",
            ToolFormat::Qwen3Coder,
            &two,
            &["<|im_end|>"],
            &nine,
        ),
        // Llama 3.1's template refuses parallel calls.
        (
            "llama31_json.jinja",
            "Llama-3.1-8B-Instruct",
            ToolFormat::Llama3Json,
            &one,
            &["<|eot_id|>", "<|eom_id|>"],
            &nine,
        ),
        (
            "llama4_pythonic.jinja",
            "Llama-4-Scout-17B-16E-Instruct",
            ToolFormat::Pythonic,
            &two,
            &["<|eot|>", "<|eom|>"],
            &nine,
        ),
        (
            "mistral.jinja",
            "Mistral-Small-3.2-24B-Instruct",
            ToolFormat::Mistral,
            &two,
            &["</s>"],
            &nine,
        ),
        (
            "deepseek_r1.jinja",
            "DeepSeek-R1",
            ToolFormat::DeepSeekV3,
            &two,
            &["<｜end▁of▁sentence｜>"],
            &nine,
        ),
        (
            "kimi_k2.jinja",
            "Kimi-K2-Instruct",
            ToolFormat::KimiK2,
            &two,
            &["<|im_end|>"],
            &kimi,
        ),
        ("glm45.jinja", "GLM-4.5", ToolFormat::Glm45, &two, &[], &nine),
        (
            "gpt_oss_harmony.jinja",
            "gpt-oss-20b",
            ToolFormat::Harmony,
            &one,
            &[],
            &nine,
        ),
    ];
    let mut failures = Vec::new();
    for (file, model, format, calls, ends, ids) in families {
        let t = template(file);
        let (inferred, reasoning) = infer(model, t.source());
        let turn = assistant_turn(&t, calls, ends, ids);
        // GLM's history keeps an (empty) think block before the calls: the reasoning parser takes it.
        let merged = parse_all_splits(&|| parser(Some(format), reasoning, false), &turn);
        let got: Vec<(String, Value)> = merged
            .calls
            .iter()
            .map(|(name, args)| (name.clone(), serde_json::from_str(args).unwrap()))
            .collect();
        let want: Vec<(String, Value)> = calls.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
        if inferred != Some(format) || got != want || !merged.content.trim().is_empty() {
            failures.push(format!(
                "{file}: inferred {inferred:?}, calls {got:?}, content {:?} from {turn:?}",
                merged.content
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
