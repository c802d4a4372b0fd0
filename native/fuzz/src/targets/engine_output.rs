//! Engine `GenerateResponse` messages for either protocol, built from random fields: stream chunks and
//! completions with tokens, usage counts and logprob lists of matching or mismatched lengths.

use extproc_core::engine::Protocol;
use extproc_core::pb::{sglang, vllm};
use prost::Message;

use crate::rng::Rng;

const FINISH_REASONS: [&str; 5] = ["stop", "length", "abort", "", "weird"];

fn ids(rng: &mut Rng, max: usize) -> Vec<u32> {
    (0..rng.size(max))
        .map(|_| {
            if rng.one_in(16) {
                u32::MAX
            } else {
                rng.below(130_000) as u32
            }
        })
        .collect()
}

fn logprob(rng: &mut Rng) -> f32 {
    match rng.below(8) {
        0 => f32::NAN,
        1 => f32::NEG_INFINITY,
        2 => 0.0,
        _ => -(rng.below(2000) as f32) / 100.0,
    }
}

macro_rules! build {
    ($pb:ident, $rng:expr) => {{
        use $pb::generate_response::Response;
        let rng: &mut Rng = $rng;
        let logprobs = |rng: &mut Rng, n: usize| {
            rng.one_in(3).then(|| {
                // Usually one per token; sometimes a length mismatch.
                let n = if rng.one_in(6) { rng.size(8) } else { n };
                $pb::OutputLogProbs {
                    token_logprobs: (0..n).map(|_| logprob(rng)).collect(),
                    token_ids: ids(rng, n),
                    top_logprobs: (0..n)
                        .map(|_| {
                            let k = rng.size(5);
                            $pb::TopLogProbs {
                                values: (0..k).map(|_| logprob(rng)).collect(),
                                token_ids: ids(rng, k),
                            }
                        })
                        .collect(),
                }
            })
        };
        let token_ids = ids(rng, 8);
        let n = token_ids.len();
        let response = match rng.below(5) {
            0 => None,
            1 => Some(Response::Complete($pb::GenerateComplete {
                output_logprobs: logprobs(rng, n),
                output_ids: token_ids,
                finish_reason: rng.pick(&FINISH_REASONS).to_string(),
                prompt_tokens: rng.below(5000) as u32,
                completion_tokens: rng.below(100) as u32,
                cached_tokens: rng.below(5000) as u32,
                index: if rng.one_in(4) { rng.below(130) as u32 } else { 0 },
                ..Default::default()
            })),
            _ => Some(Response::Chunk($pb::GenerateStreamChunk {
                output_logprobs: logprobs(rng, n),
                token_ids,
                prompt_tokens: rng.below(5000) as u32,
                completion_tokens: rng.below(100) as u32,
                cached_tokens: rng.below(5000) as u32,
                index: if rng.one_in(4) { rng.below(130) as u32 } else { 0 },
            })),
        };
        $pb::GenerateResponse {
            response,
            ..Default::default()
        }
        .encode_to_vec()
    }};
}

/// One serialized `GenerateResponse` of `protocol`.
// The macro's `..Default::default()` fills SGLang's extra fields; vLLM's message has none.
#[allow(clippy::needless_update)]
pub fn message(rng: &mut Rng, protocol: Protocol) -> Vec<u8> {
    match protocol {
        Protocol::Vllm => build!(vllm, rng),
        Protocol::Sglang => build!(sglang, rng),
    }
}

/// A final `GenerateComplete` with the given finish reason and no logprobs.
#[allow(clippy::needless_update)]
pub fn complete(protocol: Protocol, tokens: Vec<u32>, finish_reason: &str) -> Vec<u8> {
    macro_rules! done {
        ($pb:ident) => {
            $pb::GenerateResponse {
                response: Some($pb::generate_response::Response::Complete(
                    $pb::GenerateComplete {
                        completion_tokens: tokens.len() as u32,
                        output_ids: tokens,
                        finish_reason: finish_reason.to_string(),
                        prompt_tokens: 3,
                        ..Default::default()
                    },
                )),
                ..Default::default()
            }
            .encode_to_vec()
        };
    }
    match protocol {
        Protocol::Vllm => done!(vllm),
        Protocol::Sglang => done!(sglang),
    }
}
