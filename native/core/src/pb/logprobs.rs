//! `OutputLogProbs` / `TopLogProbs`: the same layout in `vllm_engine.proto` and `sglang_scheduler.proto`.

#[derive(Clone, PartialEq, prost::Message)]
pub struct OutputLogProbs {
    #[prost(float, repeated, tag = "1")]
    pub token_logprobs: Vec<f32>,
    #[prost(uint32, repeated, tag = "2")]
    pub token_ids: Vec<u32>,
    /// One entry per output position.
    #[prost(message, repeated, tag = "3")]
    pub top_logprobs: Vec<TopLogProbs>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TopLogProbs {
    #[prost(float, repeated, tag = "1")]
    pub values: Vec<f32>,
    #[prost(uint32, repeated, tag = "2")]
    pub token_ids: Vec<u32>,
}
