//! vLLM's `VllmEngine` requests from the neutral form (its responses: `super::decode`).

use prost::Message;

use super::GenerateCall;
use crate::openai::request::Constraint;
use crate::pb::vllm::sampling_params::Constraint as Wire;
use crate::pb::vllm::{
    generate_request::Input, AbortRequest, ChoiceConstraint, GenerateRequest, SamplingParams, TokenizedInput,
};

pub fn encode_generate(call: GenerateCall<'_>) -> Vec<u8> {
    let s = call.sampling;
    // vLLM reads top_p 0, top_k 0 and repetition_penalty 0 as "unset", and its other zeros are its
    // defaults; explicit optionals carry what the client meant.
    let params = SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p.unwrap_or(0.0),
        top_k: s.top_k.filter(|&k| k > 0).unwrap_or(0) as u32,
        min_p: s.min_p.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        repetition_penalty: s.repetition_penalty.unwrap_or(0.0),
        max_tokens: s.max_tokens,
        min_tokens: s.min_tokens,
        stop: s.stop.clone(),
        stop_token_ids: s.stop_token_ids.clone(),
        skip_special_tokens: s.skip_special_tokens,
        spaces_between_special_tokens: true,
        ignore_eos: s.ignore_eos,
        n: s.n,
        logprobs: s.logprobs.map(|k| k as i32),
        seed: s.seed,
        include_stop_str_in_output: call.include_stop_str_in_output,
        logit_bias: s.logit_bias.iter().copied().collect(),
        constraint: call.constraint.map(constraint),
    };
    GenerateRequest {
        request_id: call.request_id.to_string(),
        input: Some(Input::Tokenized(TokenizedInput {
            original_text: String::new(),
            input_ids: call.input_ids,
        })),
        sampling_params: Some(params),
        stream: call.stream,
        data_parallel_rank: call.data_parallel_rank.and_then(|r| i32::try_from(r).ok()),
    }
    .encode_to_vec()
}

/// Every constraint kind has its own field in vLLM's `SamplingParams.constraint`.
fn constraint(c: &Constraint) -> Wire {
    match c {
        Constraint::JsonSchema(schema) => Wire::JsonSchema(schema.clone()),
        Constraint::Regex(regex) => Wire::Regex(regex.clone()),
        Constraint::Grammar(grammar) => Wire::Grammar(grammar.clone()),
        Constraint::StructuralTag(tag) => Wire::StructuralTag(tag.clone()),
        Constraint::Choice(choices) => Wire::Choice(ChoiceConstraint {
            choices: choices.clone(),
        }),
    }
}

pub fn encode_abort(request_id: &str) -> Vec<u8> {
    AbortRequest {
        request_ids: vec![request_id.to_string()],
    }
    .encode_to_vec()
}
