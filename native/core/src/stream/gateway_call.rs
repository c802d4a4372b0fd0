//! One chat generation whose engine call the gateway makes itself, for APIs whose answer needs work the
//! Envoy path cannot do (the Responses API: stored history, several calls per request). It is prepared
//! like a routed chat request (template, tokenize, context and budget checks, the router's pick, tool-call
//! and reasoning parsing of the output) and made by the server as a batch's prompt is (`server/fanout.rs`):
//! a non-streamed `Generate`, its messages translated into one chat choice.

use std::sync::Arc;

use serde_json::Value;

use super::engine_outcome::{translate_whole, unfinished_error};
use super::output_plan;
use super::request;
use super::response::{ResponseShape, ResponseTranslator};
use super::target::{self, Target};
use super::{CallOutcome, FanoutCall};
use crate::engine::GenerateCall;
use crate::error::ApiError;
use crate::gateway::{unix_now, Limits, ServedModel};
use crate::openai::request::GenerationRequest;
use crate::openai::response::{ResponseMeta, Usage};
use crate::routing::PickRequest;

pub struct GatewayCall {
    call: Option<FanoutCall>,
    translator: ResponseTranslator,
    /// Holds the request's load on the engine until the answer is in.
    target: Target,
}

impl GatewayCall {
    /// Template, tokenize, check and route a chat request (`req.input` is chat), ready to call;
    /// `stream`: the engine streams its output, read back as chat SSE chunks (`push`).
    pub fn new(
        model: &Arc<ServedModel>,
        req: &GenerationRequest,
        engine_request_id: &str,
        routing: PickRequest<'_>,
        limits: &Limits,
        stream: bool,
    ) -> Result<GatewayCall, ApiError> {
        if !stream {
            request::check_output_budget(model, req, 1, limits.max_buffered_output_tokens)?;
        }
        let prompt = request::prompt(model, &req.input)?;
        request::check_context(model, prompt.input_ids.len(), req)?;
        let target = target::pick(
            model,
            PickRequest {
                token_ids: &prompt.input_ids,
                ..routing
            },
        )?;
        let parsing = output_plan::plan(model, req, prompt.opens_think);
        let room = model.max_context().saturating_sub(prompt.input_ids.len() as u32);
        let deadline = limits.deadlines.whole_call(req.sampling.max_tokens.unwrap_or(room));
        let body = target.protocol.encode_generate(GenerateCall {
            request_id: engine_request_id,
            input_ids: prompt.input_ids,
            sampling: &req.sampling,
            constraint: req.constraint.as_ref(),
            include_stop_str_in_output: req.include_stop_str_in_output,
            stream,
            data_parallel_rank: target.dp_rank,
        });
        let shape = ResponseShape {
            meta: ResponseMeta {
                api: req.api,
                id: format!("chatcmpl-{engine_request_id}"),
                created: unix_now(),
                model: model.name.clone(),
            },
            protocol: target.protocol,
            stream,
            include_usage: stream,
            skip_special_tokens: req.sampling.skip_special_tokens,
            stop: req.sampling.stop.clone(),
            include_stop_str_in_output: req.include_stop_str_in_output,
            stop_token_ids: request::stop_token_ids(model, req),
            echo: None,
            n: 1,
            logprobs: req.sampling.logprobs,
            parsing,
        };
        let call = FanoutCall {
            endpoint: target.address.clone(),
            fallbacks: target.fallbacks().iter().map(|f| f.to_string()).collect(),
            path: target.protocol.generate_path(),
            body,
            protocol: target.protocol,
            request_id: engine_request_id.to_string(),
            dp_rank: target.dp_rank,
            deadline,
            model: model.clone(),
        };
        Ok(GatewayCall {
            call: Some(call),
            translator: ResponseTranslator::new(model.clone(), shape, limits.max_engine_message),
            target,
        })
    }

    /// The engine's address.
    pub fn endpoint(&self) -> &str {
        &self.target.address
    }

    /// The call to make (once).
    pub fn take_call(&mut self) -> Option<FanoutCall> {
        self.call.take()
    }

    /// A streamed call's next engine message, as the chat SSE chunks it makes.
    pub fn push(&mut self, message: &[u8]) -> Result<Vec<u8>, ApiError> {
        let mut out = Vec::new();
        self.translator.push_message(message, &mut out)?;
        Ok(out)
    }

    /// A streamed call's closing chunks (the usage chunk among them), once the engine's call ended.
    pub fn finish_stream(&mut self) -> Result<Vec<u8>, ApiError> {
        if let Some(error) = unfinished_error(&self.translator) {
            return Err(error);
        }
        Ok(self.translator.finish())
    }

    /// The tokens counted so far.
    pub fn usage(&self) -> Usage {
        self.translator.usage
    }

    /// The chat choice (`{"message": {...}, "finish_reason"}`) and usage from the call's outcome.
    pub fn answer(mut self, outcome: CallOutcome) -> Result<(Value, Usage), ApiError> {
        translate_whole(&mut self.translator, outcome?)?;
        let choice = self
            .translator
            .choice_values()
            .into_iter()
            .next()
            .unwrap_or(Value::Null);
        Ok((choice, self.translator.usage))
    }
}
