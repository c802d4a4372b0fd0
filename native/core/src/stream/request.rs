//! Client request → engine request: parse, template, tokenize, check limits.

use std::time::Instant;

use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::metrics::Phase;
use crate::openai::request::{ChatInput, GenerationRequest, PromptInput};
use crate::stream::output_plan::prompt_opens_think;
use crate::template::{ChatInputs, RenderError};

/// The prompt as token ids, ready to send.
pub struct Prompt {
    pub input_ids: Vec<u32>,
    /// A chat whose rendered prompt ends inside a think block the template opened.
    pub opens_think: bool,
}

/// The prompt of any generation request but a batch, as token ids.
pub fn prompt(model: &ServedModel, input: &PromptInput) -> Result<Prompt, ApiError> {
    match input {
        PromptInput::Chat(chat) => chat_prompt(model, chat),
        PromptInput::Text(text) => {
            check_prompt_bytes(model, text.len(), "prompt")?;
            let began = Instant::now();
            let input_ids = model.files.tokenizer.encode_with_special_tokens(text);
            Phase::Tokenize.observe(began);
            Ok(Prompt {
                input_ids: input_ids.map_err(ApiError::internal)?,
                opens_think: false,
            })
        }
        PromptInput::Tokens(ids) => {
            check_token_ids(model, ids, "prompt")?;
            Ok(Prompt {
                input_ids: ids.clone(),
                opens_think: false,
            })
        }
        PromptInput::Batch(_) => Err(ApiError::internal("a batch has one prompt per part")),
    }
}

/// Client-given token ids must exist in the model's vocabulary; `param` names the field that held them.
pub fn check_token_ids(model: &ServedModel, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = model.files.tokenizer.vocab_size() as u32;
    match ids.iter().find(|&&id| id >= vocab) {
        Some(bad) => Err(ApiError::invalid_param(
            param,
            format!("token id {bad} is out of the vocabulary (size {vocab})"),
        )),
        None => Ok(()),
    }
}

/// Render the chat template for `request` (with `apply_chat_template`'s semantics) and tokenize it.
pub fn chat_prompt(model: &ServedModel, request: &ChatInput) -> Result<Prompt, ApiError> {
    if model.files.template.is_none() && model.files.named_templates.is_empty() {
        return Err(ApiError::invalid(format!(
            "model '{}' has no chat template; use /v1/completions",
            model.name
        )));
    }
    let inputs = ChatInputs {
        messages: &request.messages,
        tools: request.tools.as_ref(),
        documents: request.documents.as_deref(),
        add_generation_prompt: request.add_generation_prompt,
        continue_final_message: request.continue_final_message.then_some("content"),
        special_tokens: None,
        kwargs: Some(&request.chat_template_kwargs),
    };
    let began = Instant::now();
    let text = model.files.render_chat(None, inputs);
    let tokenizing = Phase::Template.observe(began);
    let text = text.map_err(|e| match e {
        RenderError::Raised(message) => ApiError::invalid_param("messages", message),
        RenderError::Invalid { param, message } => ApiError::invalid_param(&param, message),
        RenderError::Failed(message) => ApiError::invalid(format!("chat template failed: {message}")),
    })?;
    check_prompt_bytes(model, text.len(), "messages")?;
    let input_ids = model.files.tokenizer.encode(&text);
    Phase::Tokenize.observe(tokenizing);
    Ok(Prompt {
        input_ids: input_ids.map_err(ApiError::internal)?,
        opens_think: prompt_opens_think(&text),
    })
}

/// Refuse, before tokenizing it, a prompt text whose length alone proves it over the context: no
/// token stands for more than `model.max_token_bytes` bytes of text, so a text longer than
/// `max_context × max_token_bytes` bytes has more tokens than the context holds. The bound is generous
/// (the longest piece of a vocabulary is tens of bytes, most text 3 to 5 bytes a token); a prompt under
/// it that is still too long is refused by `check_context` once tokenized.
pub fn check_prompt_bytes(model: &ServedModel, bytes: usize, param: &str) -> Result<(), ApiError> {
    let limit = model.max_context() as usize;
    let bound = limit.saturating_mul(model.max_token_bytes);
    if bytes > bound {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "This model's maximum context length is {limit} tokens. However, your prompt is {bytes} \
                 bytes, more than any {limit} tokens of this model can hold ({bound} bytes)."
            ),
        ));
    }
    Ok(())
}

/// A non-streamed answer is held whole until it is sent: refuse, before any work, a request whose
/// answer could exceed the gateway's budget of `prompts × n × max_tokens × (top_logprobs + 1)`
/// buffered tokens. Without `max_tokens` the context bounds the completion.
pub fn check_output_budget(
    model: &ServedModel,
    request: &GenerationRequest,
    prompts: usize,
    budget: u64,
) -> Result<(), ApiError> {
    let sampling = &request.sampling;
    let max_tokens = sampling.max_tokens.unwrap_or_else(|| model.max_context());
    let per_token = u64::from(sampling.logprobs.map_or(1, |k| k + 1));
    let wanted = (prompts as u64)
        .saturating_mul(u64::from(sampling.n))
        .saturating_mul(u64::from(max_tokens))
        .saturating_mul(per_token);
    if wanted > budget {
        let prompts = if prompts > 1 {
            format!("{prompts} prompts × ")
        } else {
            String::new()
        };
        return Err(ApiError::invalid_param(
            "max_tokens",
            format!(
                "a non-streamed answer of {prompts}n {} × max_tokens {max_tokens} × (top_logprobs {} + 1) = \
                 {wanted} tokens exceeds the gateway's buffered output limit of {budget} tokens; lower n, \
                 max_tokens or top_logprobs, or set \"stream\": true",
                sampling.n,
                per_token - 1,
            ),
        ));
    }
    Ok(())
}

/// The tokens that end a choice when sampled: the request's stop token ids and, unless `ignore_eos`,
/// the model's EOS. Like vLLM, the gateway leaves such a token out of the text.
pub fn stop_token_ids(model: &ServedModel, request: &GenerationRequest) -> Vec<u32> {
    let mut ids = request.sampling.stop_token_ids.clone();
    if !request.sampling.ignore_eos {
        ids.extend(&model.files.eos_token_ids);
    }
    ids
}

/// Refuse requests the engine could not take: `logit_bias` outside the vocabulary, a prompt over the
/// context or leaving no room for `max_tokens`.
pub fn check_context(model: &ServedModel, prompt_len: usize, request: &GenerationRequest) -> Result<(), ApiError> {
    let sampling = &request.sampling;
    let vocab = model.files.tokenizer.vocab_size();
    if let Some((id, _)) = sampling.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "logit_bias",
            format!("logit_bias token id {id} is out of the vocabulary (size {vocab})"),
        ));
    }
    let param = if request.chat().is_some() { "messages" } else { "prompt" };
    let limit = model.max_context() as usize;
    let wanted = prompt_len + sampling.max_tokens.unwrap_or(0) as usize;
    if prompt_len >= limit || wanted > limit {
        return Err(ApiError::invalid_param(
            param,
            format!(
                "This model's maximum context length is {limit} tokens. However, you requested {wanted} tokens \
                 ({prompt_len} in the prompt, {} in the completion).",
                sampling.max_tokens.unwrap_or(0)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gateway::{Gateway, Limits, DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS};
    use crate::openai::request::{parse_chat_request, parse_completion_request};
    use crate::pb::ext_proc::{processing_request::Request, HeaderMap, HeaderValue, HttpBody, HttpHeaders};
    use crate::pb::ext_proc::{processing_response::Response, ProcessingRequest};
    use crate::routing::RouterConfig;
    use crate::stream::{RequestStream, INLINE_BODY_BYTES};
    use crate::test_assets::llama3_model_dir_with;

    const CONTEXT: u32 = 4096;

    fn gateway() -> Arc<Gateway> {
        let gateway = Arc::new(Gateway::new(Limits {
            max_body_bytes: 64 << 20,
            max_engine_message: 1 << 20,
            destination_fallbacks: 0,
            max_buffered_output_tokens: DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
            ..Limits::default()
        }));
        let template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
        let dir = llama3_model_dir_with("limits", &[("chat_template.jinja", template)]);
        gateway
            .add_model("m", &dir, Some(CONTEXT), "round_robin", RouterConfig::default())
            .unwrap();
        gateway
    }

    #[test]
    fn the_longest_token_bounds_the_bytes_of_a_prompt_that_fits() {
        let gateway = gateway();
        let model = gateway.model("m").unwrap();
        // Llama 3's longest pieces are runs of spaces or punctuation, tens of bytes.
        assert!(
            (16..=1024).contains(&model.max_token_bytes),
            "{}",
            model.max_token_bytes
        );
        let bound = CONTEXT as usize * model.max_token_bytes;
        assert!(check_prompt_bytes(&model, bound, "prompt").is_ok());
        let e = check_prompt_bytes(&model, bound + 1, "messages").unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("messages")));
        assert!(
            e.message.contains("maximum context length is 4096 tokens"),
            "{}",
            e.message
        );
        assert!(e.message.contains(&format!("{bound} bytes")), "{}", e.message);
        // No text that long tokenizes into the context: the bound is never wrong.
        let text = "a".repeat(bound + 1);
        let tokens = model.files.tokenizer.encode(&text).unwrap().len();
        assert!(tokens > CONTEXT as usize, "{tokens} tokens");
    }

    #[test]
    fn a_prompt_over_the_byte_bound_is_refused_without_tokenizing_it() {
        let gateway = gateway();
        let model = gateway.model("m").unwrap();
        let text = "word ".repeat(CONTEXT as usize * model.max_token_bytes / 5 + 1);
        let completion = parse_completion_request(
            serde_json::json!({"model": "m", "prompt": text, "max_tokens": 1})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let began = std::time::Instant::now();
        let e = prompt(&model, &completion.input).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert!(
            began.elapsed() < std::time::Duration::from_millis(50),
            "{:?}",
            began.elapsed()
        );
        let chat = parse_chat_request(
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let PromptInput::Chat(input) = &chat.input else {
            unreachable!()
        };
        let e = chat_prompt(&model, input).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("bytes"), "{}", e.message);
        // A chat that fits is rendered and tokenized.
        let short = parse_chat_request(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        let PromptInput::Chat(input) = &short.input else {
            unreachable!()
        };
        assert!(!chat_prompt(&model, input).unwrap().input_ids.is_empty());
    }

    #[test]
    fn a_past_tool_call_with_arguments_that_are_not_json_is_a_400_naming_them() {
        let gateway = gateway();
        let model = gateway.model("m").unwrap();
        let chat = |arguments: &str| {
            let body = serde_json::json!({"model": "m", "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "w", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "a", "content": "18C"},
            ]});
            parse_chat_request(body.to_string().as_bytes()).unwrap()
        };
        let bad = chat("{\"city\": Paris}");
        let PromptInput::Chat(input) = &bad.input else {
            unreachable!()
        };
        let e = chat_prompt(&model, input).err().unwrap();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_calls[0].function.arguments"));
        assert!(e.message.contains("is not valid JSON"), "{}", e.message);
        let good = chat("{\"city\": \"Paris\"}");
        let PromptInput::Chat(input) = &good.input else {
            unreachable!()
        };
        assert!(chat_prompt(&model, input).is_ok());
    }

    #[test]
    fn the_output_budget_counts_prompts_choices_tokens_and_top_logprobs() {
        let gateway = gateway();
        let model = gateway.model("m").unwrap();
        let request = |extra: &str| {
            parse_chat_request(
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{extra}}}"#).as_bytes(),
            )
            .unwrap()
        };
        let budget = 64 * 1000 * 21;
        let at_budget = request(r#","n":64,"max_tokens":1000,"logprobs":true,"top_logprobs":20"#);
        assert!(check_output_budget(&model, &at_budget, 1, budget).is_ok());
        let e = check_output_budget(&model, &at_budget, 1, budget - 1).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("max_tokens")));
        assert!(
            e.message.contains(&format!("limit of {} tokens", budget - 1)),
            "{}",
            e.message
        );
        assert!(e.message.contains("1344000 tokens"), "{}", e.message);
        // Prompts of a batch multiply it; without max_tokens the context bounds each choice.
        assert!(check_output_budget(&model, &at_budget, 2, budget).is_err());
        let unbounded = request(r#","n":2"#);
        assert!(check_output_budget(&model, &unbounded, 1, 2 * u64::from(CONTEXT)).is_ok());
        assert!(check_output_budget(&model, &unbounded, 1, 2 * u64::from(CONTEXT) - 1).is_err());
    }

    fn headers(path: &str) -> ProcessingRequest {
        let header = |key: &str, value: &str| HeaderValue {
            key: key.into(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        };
        ProcessingRequest {
            request: Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![header(":method", "POST"), header(":path", path)],
                }),
                end_of_stream: false,
            })),
            ..Default::default()
        }
    }

    fn body(bytes: Vec<u8>, end_of_stream: bool) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(Request::RequestBody(HttpBody {
                body: bytes,
                end_of_stream,
            })),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_message_completing_a_large_body_is_heavy() {
        let gateway = gateway();
        let mut stream = RequestStream::new(gateway.clone());
        assert!(!stream.is_heavy(&headers("/v1/completions")));
        assert!(stream.process(headers("/v1/completions")).is_empty());
        let half = vec![b' '; INLINE_BODY_BYTES / 2];
        assert!(!stream.is_heavy(&body(half.clone(), false)), "not the end of the body");
        assert!(stream.process(body(half.clone(), false)).is_empty());
        assert!(!stream.is_heavy(&body(b"{}".to_vec(), true)), "a small body in all");
        assert!(stream.is_heavy(&body(half, true)));

        let mut small = RequestStream::new(gateway);
        small.process(headers("/v1/completions"));
        let replies = small.process(body(br#"{"model":"m","prompt":"hi","max_tokens":1}"#.to_vec(), true));
        assert!(matches!(
            replies[0].response,
            Some(Response::ImmediateResponse(_)) | Some(Response::RequestHeaders(_))
        ));
        assert!(
            !small.is_heavy(&body(vec![b' '; INLINE_BODY_BYTES], true)),
            "the body phase is over"
        );
    }
}
