//! Batched completions prompts (`prompt` as a list). Envoy sends one HTTP request upstream as one gRPC
//! call, so a batch cannot go that way: each prompt is routed on its own and its non-streamed
//! `Generate` is made by the native server itself (`server/fanout.rs`); the answers come back here and
//! the client gets one `text_completion` as an immediate response, choices indexed `prompt * n + choice`
//! as vLLM numbers them. Streamed batches are refused at parsing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use super::deadline::Deadlines;
use super::engine_outcome::translate_whole;
use super::request;
use super::response::{ResponseShape, ResponseTranslator};
use super::target::{self, Target};
use crate::engine::{GenerateCall, Protocol};
use crate::error::ApiError;
use crate::gateway::{unix_now, ServedModel};
use crate::openai::request::{GenerationRequest, PromptInput};
use crate::openai::response::{completion_json, ResponseMeta, Usage};
use crate::routing::PickRequest;

/// One engine call the server must make for the batch: a non-streamed `Generate`.
#[derive(Clone)]
pub struct FanoutCall {
    /// The engine's address.
    pub endpoint: String,
    /// The next engines to try, in order, when the call fails before any answer (same protocol, and
    /// the same rank when pinned to one).
    pub fallbacks: Vec<String>,
    pub path: &'static str,
    /// The serialized (unframed) `GenerateRequest`.
    pub body: Vec<u8>,
    pub protocol: Protocol,
    /// The engine request id (for the Abort of a call that missed its deadline).
    pub request_id: String,
    /// The pinned data-parallel rank, if any (for the failure reports).
    pub dp_rank: Option<u32>,
    /// How long the engine may take to answer (`None`: no limit; `stream/deadline.rs`).
    pub deadline: Option<Duration>,
    /// Whose router hears how each attempt ended.
    pub model: Arc<ServedModel>,
}

impl std::fmt::Debug for FanoutCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanoutCall")
            .field("endpoint", &self.endpoint)
            .field("fallbacks", &self.fallbacks)
            .field("request_id", &self.request_id)
            .finish()
    }
}

/// What became of one call: the engine's messages, or the error it ended with.
pub type CallOutcome = Result<Vec<Bytes>, ApiError>;

/// One prompt of the batch: where it goes, its request until the server takes it, its answer so far.
struct Part {
    target: Target,
    request_id: String,
    deadline: Option<Duration>,
    generate: Option<Vec<u8>>,
    translator: ResponseTranslator,
}

pub struct Batch {
    model: Arc<ServedModel>,
    meta: ResponseMeta,
    n: u32,
    parts: Vec<Part>,
}

impl Batch {
    /// Tokenize, check and route every prompt; nothing is sent before all of them passed.
    pub fn new(
        model: &Arc<ServedModel>,
        req: &GenerationRequest,
        prompts: &[PromptInput],
        request_id: &str,
        routing: PickRequest<'_>,
        max_message: usize,
        deadlines: Deadlines,
    ) -> Result<Batch, ApiError> {
        let meta = ResponseMeta {
            api: req.api,
            id: format!("cmpl-{request_id}"),
            created: unix_now(),
            model: model.name.clone(),
        };
        let mut parts = Vec::with_capacity(prompts.len());
        for (i, input) in prompts.iter().enumerate() {
            let prompt = request::prompt(model, input)?;
            request::check_context(model, prompt.input_ids.len(), req)?;
            let target = target::pick(
                model,
                PickRequest {
                    token_ids: &prompt.input_ids,
                    ..routing
                },
            )?;
            let echo = req.echo.then(|| model.files.tokenizer.decode(&prompt.input_ids, false));
            let part_id = format!("{request_id}-{i}");
            let room = model.max_context().saturating_sub(prompt.input_ids.len() as u32);
            let deadline = deadlines.whole_call(req.sampling.max_tokens.unwrap_or(room));
            let generate = target.protocol.encode_generate(GenerateCall {
                request_id: &part_id,
                input_ids: prompt.input_ids,
                sampling: &req.sampling,
                constraint: req.constraint.as_ref(),
                include_stop_str_in_output: req.include_stop_str_in_output,
                stream: false,
                data_parallel_rank: target.dp_rank,
            });
            let shape = ResponseShape {
                meta: meta.clone(),
                protocol: target.protocol,
                stream: false,
                include_usage: false,
                skip_special_tokens: req.sampling.skip_special_tokens,
                stop: req.sampling.stop.clone(),
                include_stop_str_in_output: req.include_stop_str_in_output,
                stop_token_ids: request::stop_token_ids(model, req),
                echo,
                n: req.sampling.n,
                logprobs: req.sampling.logprobs,
                // Batches are completions: their text is never parsed.
                parsing: None,
            };
            parts.push(Part {
                target,
                request_id: part_id,
                deadline,
                generate: Some(generate),
                translator: ResponseTranslator::new(model.clone(), shape, max_message),
            });
        }
        Ok(Batch {
            model: model.clone(),
            meta,
            n: req.sampling.n,
            parts,
        })
    }

    /// The calls to make, in prompt order; empty once taken.
    pub fn take_calls(&mut self) -> Vec<FanoutCall> {
        self.parts
            .iter_mut()
            .filter_map(|part| {
                Some(FanoutCall {
                    endpoint: part.target.address.clone(),
                    fallbacks: part.target.fallbacks().iter().map(|f| f.to_string()).collect(),
                    path: part.target.protocol.generate_path(),
                    body: part.generate.take()?,
                    protocol: part.target.protocol,
                    request_id: part.request_id.clone(),
                    dp_rank: part.target.dp_rank,
                    deadline: part.deadline,
                    model: self.model.clone(),
                })
            })
            .collect()
    }

    /// The engines the prompts went to, comma-separated in prompt order.
    pub fn endpoints(&self) -> String {
        let addresses: Vec<&str> = self.parts.iter().map(|p| p.target.address.as_str()).collect();
        addresses.join(",")
    }

    /// The whole answer from every call's outcome (in call order), or the first failure.
    pub fn answer(&mut self, outcomes: Vec<CallOutcome>) -> Result<(Vec<u8>, Usage), ApiError> {
        if outcomes.len() != self.parts.len() {
            return Err(ApiError::internal("a batched prompt got no answer"));
        }
        let mut usage = Usage::default();
        let mut choices = Vec::new();
        for (i, (part, outcome)) in self.parts.iter_mut().zip(outcomes).enumerate() {
            translate_whole(&mut part.translator, outcome?)?;
            for (j, mut choice) in part.translator.choice_values().into_iter().enumerate() {
                choice["index"] = json!(i as u64 * u64::from(self.n) + j as u64);
                choices.push(choice);
            }
            let u = part.translator.usage;
            usage.prompt_tokens += u.prompt_tokens;
            usage.completion_tokens += u.completion_tokens;
            usage.cached_tokens += u.cached_tokens;
        }
        Ok((completion_json(&self.meta, choices, usage), usage))
    }
}
