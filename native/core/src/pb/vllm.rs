//! vLLM `vllm.grpc.engine` messages (from `smg-grpc-proto`'s `vllm_engine.proto`).

use std::collections::BTreeMap;

pub use super::logprobs::{OutputLogProbs, TopLogProbs};

#[derive(Clone, PartialEq, prost::Message)]
pub struct SamplingParams {
    #[prost(float, optional, tag = "1")]
    pub temperature: Option<f32>,
    #[prost(float, tag = "2")]
    pub top_p: f32,
    #[prost(uint32, tag = "3")]
    pub top_k: u32,
    #[prost(float, tag = "4")]
    pub min_p: f32,
    #[prost(float, tag = "5")]
    pub frequency_penalty: f32,
    #[prost(float, tag = "6")]
    pub presence_penalty: f32,
    #[prost(float, tag = "7")]
    pub repetition_penalty: f32,
    #[prost(uint32, optional, tag = "8")]
    pub max_tokens: Option<u32>,
    #[prost(uint32, tag = "9")]
    pub min_tokens: u32,
    #[prost(string, repeated, tag = "10")]
    pub stop: Vec<String>,
    #[prost(uint32, repeated, tag = "11")]
    pub stop_token_ids: Vec<u32>,
    #[prost(bool, tag = "12")]
    pub skip_special_tokens: bool,
    #[prost(bool, tag = "13")]
    pub spaces_between_special_tokens: bool,
    #[prost(bool, tag = "14")]
    pub ignore_eos: bool,
    #[prost(uint32, tag = "15")]
    pub n: u32,
    /// Top alternatives per output token (the sampled token's own logprob always comes); unset for none.
    #[prost(int32, optional, tag = "22")]
    pub logprobs: Option<i32>,
    #[prost(int32, optional, tag = "24")]
    pub seed: Option<i32>,
    #[prost(bool, tag = "25")]
    pub include_stop_str_in_output: bool,
    #[prost(btree_map = "int32, float", tag = "26")]
    pub logit_bias: BTreeMap<i32, f32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TokenizedInput {
    #[prost(string, tag = "1")]
    pub original_text: String,
    #[prost(uint32, repeated, tag = "2")]
    pub input_ids: Vec<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(message, optional, tag = "2")]
    pub tokenized: Option<TokenizedInput>,
    #[prost(message, optional, tag = "4")]
    pub sampling_params: Option<SamplingParams>,
    #[prost(bool, tag = "5")]
    pub stream: bool,
    /// The DP rank to pin the request to; unset lets the engine balance over its ranks.
    #[prost(int32, optional, tag = "9")]
    pub data_parallel_rank: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateStreamChunk {
    #[prost(uint32, repeated, tag = "1")]
    pub token_ids: Vec<u32>,
    #[prost(uint32, tag = "2")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "3")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub cached_tokens: u32,
    #[prost(message, optional, tag = "5")]
    pub output_logprobs: Option<OutputLogProbs>,
    #[prost(uint32, tag = "7")]
    pub index: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateComplete {
    #[prost(uint32, repeated, tag = "1")]
    pub output_ids: Vec<u32>,
    #[prost(string, tag = "2")]
    pub finish_reason: String,
    #[prost(uint32, tag = "3")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "5")]
    pub cached_tokens: u32,
    #[prost(message, optional, tag = "6")]
    pub output_logprobs: Option<OutputLogProbs>,
    #[prost(uint32, tag = "8")]
    pub index: u32,
    #[prost(oneof = "generate_complete::MatchedStop", tags = "10, 11")]
    pub matched_stop: Option<generate_complete::MatchedStop>,
}

pub mod generate_complete {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum MatchedStop {
        #[prost(uint32, tag = "10")]
        MatchedTokenId(u32),
        #[prost(string, tag = "11")]
        MatchedStopStr(String),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateResponse {
    #[prost(oneof = "generate_response::Response", tags = "1, 2")]
    pub response: Option<generate_response::Response>,
}

pub mod generate_response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "1")]
        Chunk(super::GenerateStreamChunk),
        #[prost(message, tag = "2")]
        Complete(super::GenerateComplete),
    }
}

/// vLLM aborts a list of requests.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AbortRequest {
    #[prost(string, repeated, tag = "1")]
    pub request_ids: Vec<String>,
}

/// The gRPC method paths on a vLLM engine.
pub const GENERATE_PATH: &str = "/vllm.grpc.engine.VllmEngine/Generate";
pub const ABORT_PATH: &str = "/vllm.grpc.engine.VllmEngine/Abort";
