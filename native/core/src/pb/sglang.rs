//! SGLang `sglang.grpc.scheduler` messages (from `smg-grpc-proto`'s `sglang_scheduler.proto`).
//!
//! Unlike vLLM's, SGLang's sampling fields have no explicit presence: proto3 zeros are sent as values
//! (temperature 0 is greedy, top_p 0 is invalid), so every field must be filled with what was meant.

use std::collections::HashMap;

pub use super::logprobs::{OutputLogProbs, TopLogProbs};

#[derive(Clone, PartialEq, prost::Message)]
pub struct SamplingParams {
    #[prost(float, tag = "1")]
    pub temperature: f32,
    #[prost(float, tag = "2")]
    pub top_p: f32,
    #[prost(int32, tag = "3")]
    pub top_k: i32,
    #[prost(float, tag = "4")]
    pub min_p: f32,
    #[prost(float, tag = "5")]
    pub frequency_penalty: f32,
    #[prost(float, tag = "6")]
    pub presence_penalty: f32,
    #[prost(float, tag = "7")]
    pub repetition_penalty: f32,
    #[prost(uint32, optional, tag = "8")]
    pub max_new_tokens: Option<u32>,
    #[prost(string, repeated, tag = "9")]
    pub stop: Vec<String>,
    #[prost(uint32, repeated, tag = "10")]
    pub stop_token_ids: Vec<u32>,
    #[prost(bool, tag = "11")]
    pub skip_special_tokens: bool,
    #[prost(bool, tag = "12")]
    pub spaces_between_special_tokens: bool,
    #[prost(uint32, tag = "17")]
    pub n: u32,
    #[prost(uint32, tag = "18")]
    pub min_new_tokens: u32,
    #[prost(bool, tag = "19")]
    pub ignore_eos: bool,
    /// Keep the matched stop string in the output (vLLM's `include_stop_str_in_output`).
    #[prost(bool, tag = "20")]
    pub no_stop_trim: bool,
    #[prost(map = "string, float", tag = "22")]
    pub logit_bias: HashMap<String, f32>,
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
    pub return_logprob: bool,
    /// Where input (prompt) logprobs start; -1 for none (0 would ask for the whole prompt's).
    #[prost(int32, tag = "6")]
    pub logprob_start_len: i32,
    #[prost(int32, tag = "7")]
    pub top_logprobs_num: i32,
    /// The DP rank to pin the request to (explicit presence: a pin to rank 0 is not "no pin").
    #[prost(int32, optional, tag = "16")]
    pub data_parallel_rank: Option<i32>,
    #[prost(bool, tag = "17")]
    pub stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateStreamChunk {
    #[prost(uint32, repeated, tag = "1")]
    pub token_ids: Vec<u32>,
    #[prost(uint32, tag = "2")]
    pub prompt_tokens: u32,
    /// Cumulative, unlike vLLM's per-chunk count.
    #[prost(uint32, tag = "3")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub cached_tokens: u32,
    #[prost(message, optional, tag = "5")]
    pub output_logprobs: Option<OutputLogProbs>,
    #[prost(uint32, tag = "8")]
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
    #[prost(uint32, tag = "11")]
    pub index: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateResponse {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(oneof = "generate_response::Response", tags = "2, 3")]
    pub response: Option<generate_response::Response>,
}

pub mod generate_response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "2")]
        Chunk(super::GenerateStreamChunk),
        #[prost(message, tag = "3")]
        Complete(super::GenerateComplete),
    }
}

/// SGLang aborts one request at a time.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AbortRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(string, tag = "2")]
    pub reason: String,
}

pub const GENERATE_PATH: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
pub const ABORT_PATH: &str = "/sglang.grpc.scheduler.SglangScheduler/Abort";
