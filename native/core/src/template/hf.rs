//! `apply_chat_template` as `transformers` (5.x) does it, around the template render.
//!
//! Before rendering: message keys whose value is null are dropped; a message's reasoning is also
//! given as `thinking` and `reasoning_content`; the named special tokens (`bos_token`, ...) are
//! visible, overridden by `chat_template_kwargs`; `tools` and `documents` are always defined (none
//! when absent, which jinja2 calls neither iterable nor sized). `continue_final_message` marks the end
//! of the final message, renders, and cuts the prompt right after that message's text.
//!
//! One step is vLLM's, not `transformers`': assistant tool calls' `function.arguments` strings are
//! parsed to objects before rendering (see `tool_calls`).

use serde_json::{Map, Value as Json};

use super::python::strip;
use super::tool_calls::prepare_tool_calls;
use super::{ChatTemplate, RenderError};

/// Where `continue_final_message` finds the text to cut after (and the names reasoning goes by).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// Everything `apply_chat_template` takes besides the template.
#[derive(Clone, Copy, Default)]
pub struct ChatInputs<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a Json>,
    pub documents: Option<&'a Json>,
    pub add_generation_prompt: bool,
    /// `continue_final_message`: `Some("content")` for `true`, or the name of the field to continue.
    pub continue_final_message: Option<&'a str>,
    /// The named special tokens (`bos_token`, `eos_token`, ...), visible unless `kwargs` override them.
    pub special_tokens: Option<&'a Map<String, Json>>,
    /// `chat_template_kwargs`.
    pub kwargs: Option<&'a Map<String, Json>>,
}

fn invalid(message: impl Into<String>) -> RenderError {
    RenderError::Raised(message.into())
}

/// `{"thinking": r, **message, "reasoning_content": r}` when the message has reasoning `r`.
fn alias_reasoning(message: Map<String, Json>) -> Map<String, Json> {
    let Some(reasoning) = REASONING_FIELDS
        .iter()
        .find_map(|f| message.get(*f).filter(|v| !v.is_null()))
        .cloned()
    else {
        return message;
    };
    let mut aliased = Map::new();
    aliased.insert("thinking".into(), reasoning.clone());
    for (key, value) in message {
        aliased.insert(key, value);
    }
    aliased.insert("reasoning_content".into(), reasoning);
    aliased
}

/// Appends the tag to the final message; returns the text the rendered prompt must contain.
fn tag_final_message(chat: &mut [Map<String, Json>], field: &str, source: &str) -> Result<String, RenderError> {
    let last = chat
        .last_mut()
        .ok_or_else(|| invalid("continue_final_message is set but the conversation is empty!"))?;
    let final_message = last.get(field).filter(|v| !v.is_null()).cloned().ok_or_else(|| {
        invalid(format!(
            "continue_final_message is set but the final message has no \"{field}\" to continue!"
        ))
    })?;
    let fields: Vec<&str> = if REASONING_FIELDS.contains(&field) {
        REASONING_FIELDS
            .into_iter()
            .filter(|f| last.get(*f) == Some(&final_message))
            .collect()
    } else {
        vec![field]
    };
    if !fields.iter().any(|f| source.contains(f)) {
        return Err(invalid(format!(
            "continue_final_message is set to \"{field}\" but this is not an accepted field in the chat_template"
        )));
    }
    if let Json::Array(blocks) = last.get_mut(field).expect("present") {
        for block in blocks.iter_mut().rev() {
            if let Some(Json::String(text)) = block.get_mut("text") {
                let original = text.clone();
                text.push_str(CONTINUE_TAG);
                return Ok(original);
            }
        }
        return Err(invalid(
            "continue_final_message is set but we could not find any text to continue in the final message!",
        ));
    }
    let Json::String(text) = &final_message else {
        return Err(invalid("continue_final_message: the final message is not text"));
    };
    for f in fields {
        if let Some(Json::String(value)) = last.get_mut(f) {
            value.push_str(CONTINUE_TAG);
        }
    }
    Ok(text.clone())
}

impl ChatTemplate {
    /// Render `inputs` exactly as `tokenizer.apply_chat_template(..., tokenize=False)` would, given
    /// the messages with tool-call arguments parsed (as vLLM gives them).
    pub fn apply(&self, inputs: &ChatInputs) -> Result<String, RenderError> {
        if inputs.messages.is_empty() {
            return Err(invalid(
                "Cannot apply chat template to an empty conversation. Provide at least one message.",
            ));
        }
        if inputs.continue_final_message.is_some() && inputs.add_generation_prompt {
            return Err(invalid(
                "continue_final_message and add_generation_prompt are not compatible.",
            ));
        }
        let mut chat = Vec::with_capacity(inputs.messages.len());
        for (index, message) in inputs.messages.iter().enumerate() {
            let Json::Object(fields) = message else {
                return Err(invalid(format!("Chat messages should be dicts, but got {message}.")));
            };
            let mut kept = fields
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            prepare_tool_calls(index, &mut kept)?;
            chat.push(alias_reasoning(kept));
        }
        let final_text = match inputs.continue_final_message {
            Some(field) => Some(tag_final_message(&mut chat, field, self.source())?),
            None => None,
        };

        let mut context = inputs.special_tokens.cloned().unwrap_or_default();
        for (key, value) in inputs.kwargs.into_iter().flatten() {
            if ["messages", "tools", "documents", "add_generation_prompt"].contains(&key.as_str()) {
                return Err(invalid(format!(
                    "render() got multiple values for keyword argument '{key}'"
                )));
            }
            context.insert(key.clone(), value.clone());
        }
        context.insert(
            "messages".into(),
            Json::Array(chat.into_iter().map(Json::Object).collect()),
        );
        context.insert("tools".into(), inputs.tools.cloned().unwrap_or(Json::Null));
        context.insert("documents".into(), inputs.documents.cloned().unwrap_or(Json::Null));
        context.insert("add_generation_prompt".into(), Json::Bool(inputs.add_generation_prompt));
        let rendered = self.render(minijinja::Value::from_serialize(&context))?;

        let Some(final_text) = final_text else {
            return Ok(rendered);
        };
        let tag = CONTINUE_TAG.trim_end();
        let wanted = strip(&final_text, None, true, true);
        if !rendered.contains(wanted) || !rendered.contains(tag) {
            return Err(invalid(
                "continue_final_message is set but the final message does not appear in the chat after applying the \
                 chat template!",
            ));
        }
        let at = rendered.rfind(tag).expect("contains the tag");
        Ok(if rendered[at..].starts_with(CONTINUE_TAG) {
            rendered[..at].to_string()
        } else {
            strip(&rendered[..at], None, false, true).to_string()
        })
    }
}
