//! Assistant tool calls as chat templates expect them: `function.arguments` an object, not a string.
//!
//! The OpenAI API sends a past call's arguments as a JSON string; templates (Qwen 2.5, Llama 3.1,
//! Qwen3-Coder, GLM, ...) `tojson` them or iterate their items, so a string would be double-encoded or
//! fail. Like vLLM before it calls `apply_chat_template`, assistant messages' `tool_calls` are
//! rewritten: a string argument is parsed, an absent, null or empty one becomes `{}`, an object is kept,
//! and an empty `tool_calls` list is dropped (so templates take their plain-answer path). Unlike
//! current vLLM, which logs and sends `{}`, arguments that are not JSON or not an object are refused
//! (a 400 naming `messages[i].tool_calls[j].function.arguments`): silently prompting the model with a
//! call it never made would change the conversation.

use serde_json::{Map, Value as Json};

use super::RenderError;

fn invalid(param: String, what: &str) -> RenderError {
    RenderError::Invalid {
        message: format!("{param} {what}"),
        param,
    }
}

/// Rewrites the tool calls of `message` (the `index`-th of the conversation) in place.
pub fn prepare_tool_calls(index: usize, message: &mut Map<String, Json>) -> Result<(), RenderError> {
    if message.get("role").and_then(Json::as_str) != Some("assistant") {
        return Ok(());
    }
    let Some(Json::Array(calls)) = message.get_mut("tool_calls") else {
        return Ok(());
    };
    if calls.is_empty() {
        message.remove("tool_calls");
        return Ok(());
    }
    for (j, call) in calls.iter_mut().enumerate() {
        let param = format!("messages[{index}].tool_calls[{j}]");
        let Json::Object(call) = call else {
            return Err(invalid(param, "must be an object"));
        };
        if call.get("type").is_some_and(|t| t != "function") {
            return Err(invalid(format!("{param}.type"), "must be \"function\""));
        }
        let Some(Json::Object(function)) = call.get_mut("function") else {
            return Err(invalid(format!("{param}.function"), "must be an object"));
        };
        let param = format!("{param}.function.arguments");
        let parsed = match function.remove("arguments") {
            None | Some(Json::Null) => Json::Object(Map::new()),
            Some(Json::String(text)) if text.is_empty() => Json::Object(Map::new()),
            Some(Json::String(text)) => match serde_json::from_str::<Json>(&text) {
                Ok(value @ Json::Object(_)) => value,
                Ok(_) => return Err(invalid(param, "must encode a JSON object")),
                Err(e) => return Err(invalid(param, &format!("is not valid JSON: {e}"))),
            },
            Some(value @ Json::Object(_)) => value,
            Some(_) => return Err(invalid(param, "must be a JSON string (or an object)")),
        };
        function.insert("arguments".into(), parsed);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prepared(index: usize, message: Json) -> Result<Json, RenderError> {
        let Json::Object(mut message) = message else {
            panic!("an object")
        };
        prepare_tool_calls(index, &mut message)?;
        Ok(Json::Object(message))
    }

    fn assistant_calling(arguments: Json) -> Json {
        json!({"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": arguments}}
        ]})
    }

    #[test]
    fn tool_call_string_arguments_become_objects_and_objects_are_kept() {
        let message = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"city\": \"Paris\", \"n\": [1, 2.5]}"}},
            {"id": "b", "function": {"name": "g", "arguments": {"x": true}}},
        ]});
        let out = prepared(1, message).unwrap();
        assert_eq!(
            out["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris", "n": [1, 2.5]})
        );
        assert_eq!(out["tool_calls"][1]["function"]["arguments"], json!({"x": true}));
        assert_eq!(out["tool_calls"][0]["id"], "a");
    }

    #[test]
    fn tool_call_absent_null_or_empty_arguments_become_an_empty_object() {
        for arguments in [json!(null), json!("")] {
            let out = prepared(0, assistant_calling(arguments)).unwrap();
            assert_eq!(out["tool_calls"][0]["function"]["arguments"], json!({}));
        }
        let out = prepared(
            0,
            json!({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}),
        )
        .unwrap();
        assert_eq!(out["tool_calls"][0]["function"]["arguments"], json!({}));
    }

    #[test]
    fn tool_call_invalid_arguments_are_refused_naming_the_param() {
        for (arguments, why) in [
            (json!("{\"city\": "), "is not valid JSON"),
            (json!("[1, 2]"), "must encode a JSON object"),
            (json!("\"Paris\""), "must encode a JSON object"),
            (json!(5), "must be a JSON string"),
        ] {
            let Err(RenderError::Invalid { param, message }) = prepared(2, assistant_calling(arguments)) else {
                panic!("refused")
            };
            assert_eq!(param, "messages[2].tool_calls[0].function.arguments");
            assert!(message.starts_with(&param) && message.contains(why), "{message}");
        }
        let bad_call = json!({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}, "call"]});
        assert!(
            matches!(prepared(3, bad_call), Err(RenderError::Invalid { param, .. }) if param == "messages[3].tool_calls[1]")
        );
        let not_function = json!({"role": "assistant", "tool_calls": [{"type": "code", "function": {}}]});
        assert!(
            matches!(prepared(0, not_function), Err(RenderError::Invalid { param, .. }) if param == "messages[0].tool_calls[0].type")
        );
    }

    #[test]
    fn tool_call_lists_empty_dropped_other_roles_untouched() {
        let out = prepared(0, json!({"role": "assistant", "content": "hi", "tool_calls": []})).unwrap();
        assert_eq!(out, json!({"role": "assistant", "content": "hi"}));
        let user = json!({"role": "user", "tool_calls": [{"function": {"arguments": "not json"}}]});
        assert_eq!(prepared(0, user.clone()).unwrap(), user);
    }
}
