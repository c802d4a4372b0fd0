//! SGLang's `SglangScheduler` requests from the neutral form (its responses: `super::decode`).
//!
//! SGLang's proto3 sampling fields have no presence, so a zero is read as a value; every field the
//! client left out is sent as SGLang's own default (`sampling_params.py`): temperature 1, top_p 1,
//! top_k -1 (all), min_p 0, penalties 0 and repetition 1.

use prost::Message;

use super::GenerateCall;
use crate::openai::request::Constraint;
use crate::openai::structured::choice_regex;
use crate::pb::sglang::sampling_params::Constraint as Wire;
use crate::pb::sglang::{AbortRequest, GenerateRequest, SamplingParams, TokenizedInput};

pub const DEFAULT_TEMPERATURE: f32 = 1.0;
pub const DEFAULT_TOP_P: f32 = 1.0;
pub const ALL_TOP_K: i32 = -1;
pub const DEFAULT_REPETITION_PENALTY: f32 = 1.0;

pub fn encode_generate(call: GenerateCall<'_>) -> Vec<u8> {
    let s = call.sampling;
    let params = SamplingParams {
        temperature: s.temperature.unwrap_or(DEFAULT_TEMPERATURE),
        top_p: s.top_p.unwrap_or(DEFAULT_TOP_P),
        // OpenAI-style 0 and -1 both mean "no top-k"; SGLang spells that -1.
        top_k: s.top_k.filter(|&k| k > 0).unwrap_or(ALL_TOP_K),
        min_p: s.min_p.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(DEFAULT_REPETITION_PENALTY),
        max_new_tokens: s.max_tokens,
        stop: s.stop.clone(),
        stop_token_ids: s.stop_token_ids.clone(),
        skip_special_tokens: s.skip_special_tokens,
        spaces_between_special_tokens: true,
        n: s.n,
        min_new_tokens: s.min_tokens,
        ignore_eos: s.ignore_eos,
        no_stop_trim: call.include_stop_str_in_output,
        logit_bias: s.logit_bias.iter().map(|&(id, bias)| (id.to_string(), bias)).collect(),
        constraint: call.constraint.map(constraint),
    };
    GenerateRequest {
        request_id: call.request_id.to_string(),
        tokenized: Some(TokenizedInput {
            original_text: String::new(),
            input_ids: call.input_ids,
        }),
        sampling_params: Some(params),
        return_logprob: s.logprobs.is_some(),
        // Output logprobs only: a 0 here would ask for the logprob of every prompt token.
        logprob_start_len: -1,
        top_logprobs_num: s.logprobs.unwrap_or(0) as i32,
        stream: call.stream,
        data_parallel_rank: call.data_parallel_rank.and_then(|r| i32::try_from(r).ok()),
    }
    .encode_to_vec()
}

/// SGLang's `SamplingParams.constraint`; it has no choice kind, so a choice goes as the regex that
/// matches exactly one of the choices.
fn constraint(c: &Constraint) -> Wire {
    match c {
        Constraint::JsonSchema(schema) => Wire::JsonSchema(schema.clone()),
        Constraint::Regex(regex) => Wire::Regex(regex.clone()),
        Constraint::Grammar(grammar) => Wire::EbnfGrammar(grammar.clone()),
        Constraint::StructuralTag(tag) => Wire::StructuralTag(tag.clone()),
        Constraint::Choice(choices) => Wire::Regex(choice_regex(choices)),
    }
}

pub fn encode_abort(request_id: &str) -> Vec<u8> {
    AbortRequest {
        request_id: request_id.to_string(),
        reason: "client disconnected".to_string(),
    }
    .encode_to_vec()
}
