//! The engine protocols the gateway speaks (vLLM `VllmEngine`, SGLang `SglangScheduler`), behind one
//! neutral form: the stream code hands over prompt ids and sampling parameters and gets back `Output`s
//! (choice index, new token ids, their logprobs, counts, finish reason), whatever the engine.

mod decode;
mod sglang;
mod vllm;

use std::fmt;
use std::str::FromStr;

use crate::openai::request::{Constraint, Sampling};

/// Which gRPC service an engine endpoint serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub enum Protocol {
    #[default]
    Vllm,
    Sglang,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Vllm => "vllm",
            Protocol::Sglang => "sglang",
        }
    }
}

/// One generation to ask of an engine.
pub struct GenerateCall<'a> {
    pub request_id: &'a str,
    pub input_ids: Vec<u32>,
    pub sampling: &'a Sampling,
    /// The output constraint, set in each protocol's own `constraint` field.
    pub constraint: Option<&'a Constraint>,
    pub include_stop_str_in_output: bool,
    pub stream: bool,
    /// The data-parallel rank to pin the request to; `None` lets the engine balance over its ranks.
    pub data_parallel_rank: Option<u32>,
}

/// One sampled token's logprob and the top alternatives the engine reported at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// One engine message, in neutral terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Output {
    /// Which of the `n` choices it belongs to.
    pub index: u32,
    /// New tokens of that choice (a streamed end repeats nothing: its tokens were already sent).
    pub token_ids: Vec<u32>,
    /// Logprobs of `token_ids`, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    /// Set on the choice's last message.
    pub finish_reason: Option<String>,
}

impl Protocol {
    /// The gRPC method path of `Generate`.
    pub fn generate_path(self) -> &'static str {
        match self {
            Protocol::Vllm => crate::pb::vllm::GENERATE_PATH,
            Protocol::Sglang => crate::pb::sglang::GENERATE_PATH,
        }
    }

    /// The serialized `GenerateRequest` (not yet gRPC-framed).
    pub fn encode_generate(self, call: GenerateCall<'_>) -> Vec<u8> {
        match self {
            Protocol::Vllm => vllm::encode_generate(call),
            Protocol::Sglang => sglang::encode_generate(call),
        }
    }

    /// One serialized `GenerateResponse`; `None` for a message with no output. In a stream, the final
    /// message repeats the last delta, so its tokens are dropped; a non-streamed one carries them all.
    pub fn decode_response(self, message: &[u8], stream: bool) -> Result<Option<Output>, String> {
        decode::generate_response(self, message, stream)
    }

    /// The gRPC method path and serialized request of `Abort` for one request.
    pub fn abort(self, request_id: &str) -> (&'static str, Vec<u8>) {
        match self {
            Protocol::Vllm => (crate::pb::vllm::ABORT_PATH, vllm::encode_abort(request_id)),
            Protocol::Sglang => (crate::pb::sglang::ABORT_PATH, sglang::encode_abort(request_id)),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(Protocol::Vllm),
            "sglang" => Ok(Protocol::Sglang),
            other => Err(format!(
                "unknown engine protocol {other:?} (expected \"vllm\" or \"sglang\")"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Protocol;

    #[test]
    fn protocols_parse_by_name_only() {
        assert_eq!("vllm".parse::<Protocol>(), Ok(Protocol::Vllm));
        assert_eq!("sglang".parse::<Protocol>(), Ok(Protocol::Sglang));
        assert!("SGLang".parse::<Protocol>().is_err());
        assert!("".parse::<Protocol>().is_err());
    }
}

#[cfg(test)]
mod protocol_tests;
