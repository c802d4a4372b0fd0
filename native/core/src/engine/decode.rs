//! One decode of engine output for both protocols. vLLM's and SGLang's `GenerateResponse`,
//! `GenerateStreamChunk`, `GenerateComplete` and `OutputLogProbs` hold the fields the gateway reads
//! under the same names and types (only the field numbers differ, which prost handles), so one
//! macro body reads either generated module.

use super::{Output, Protocol, TokenLogprob};

/// Decodes a serialized `GenerateResponse` of the generated module `crate::pb::$pb` into an `Output`.
macro_rules! decode_generate_response {
    ($pb:ident, $message:expr, $stream:expr) => {{
        use crate::pb::$pb::{generate_response::Response, GenerateResponse};
        use prost::Message;
        let message = GenerateResponse::decode($message).map_err(|e| e.to_string())?;
        let logprobs = |lp: Option<crate::pb::$pb::OutputLogProbs>| {
            lp.map(|lp| {
                let top = lp.top_logprobs.into_iter().map(|t| (t.token_ids, t.values));
                logprobs_of(lp.token_ids, lp.token_logprobs, top)
            })
            .unwrap_or_default()
        };
        Ok(match message.response {
            Some(Response::Chunk(c)) => Some(Output {
                index: c.index,
                token_ids: c.token_ids,
                logprobs: logprobs(c.output_logprobs),
                prompt_tokens: c.prompt_tokens,
                cached_tokens: c.cached_tokens,
                finish_reason: None,
            }),
            Some(Response::Complete(c)) => {
                // Streamed, the end repeats the last chunk's tokens and carries cumulative logprobs:
                // both were sent already. Non-streamed, it carries the whole output.
                let (token_ids, lp) = if $stream {
                    (Vec::new(), None)
                } else {
                    (c.output_ids, c.output_logprobs)
                };
                Some(Output {
                    index: c.index,
                    token_ids,
                    logprobs: logprobs(lp),
                    prompt_tokens: c.prompt_tokens,
                    cached_tokens: c.cached_tokens,
                    finish_reason: Some(c.finish_reason),
                })
            }
            None => None,
        })
    }};
}

/// One serialized `GenerateResponse` of `protocol`; `None` for a message with no output.
pub(super) fn generate_response(protocol: Protocol, message: &[u8], stream: bool) -> Result<Option<Output>, String> {
    match protocol {
        Protocol::Vllm => decode_generate_response!(vllm, message, stream),
        Protocol::Sglang => decode_generate_response!(sglang, message, stream),
    }
}

/// Logprobs as both protos carry them: parallel lists, one entry per output position. The top lists
/// come most likely first whatever the engine's order (vLLM's servicer puts the sampled token first).
fn logprobs_of(
    token_ids: Vec<u32>,
    token_logprobs: Vec<f32>,
    mut top: impl Iterator<Item = (Vec<u32>, Vec<f32>)>,
) -> Vec<TokenLogprob> {
    token_ids
        .into_iter()
        .zip(token_logprobs)
        .map(|(id, logprob)| {
            let mut top: Vec<(u32, f32)> = top
                .next()
                .map(|(ids, values)| ids.into_iter().zip(values).collect())
                .unwrap_or_default();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            TokenLogprob { id, logprob, top }
        })
        .collect()
}
