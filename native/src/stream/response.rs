//! Engine response → client response: gRPC frames to text, OpenAI JSON or SSE.

use prost::Message;
use serde_json::json;

use crate::detokenize::IncrementalDecoder;
use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::grpc_frame::{FrameDecoder, FrameError};
use crate::openai::chat_response::{chunk_event, completion_json, error_event, usage_event, ResponseMeta, Usage, SSE_DONE};
use crate::pb::vllm::{generate_response, GenerateResponse};
use std::sync::Arc;

/// What the engine has said so far, translated.
pub struct ResponseTranslator {
    pub model: Arc<ServedModel>,
    pub meta: ResponseMeta,
    pub stream: bool,
    include_usage: bool,
    frames: FrameDecoder,
    decoder: IncrementalDecoder,
    /// Non-streamed answers collect their text here.
    text: String,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    role_sent: bool,
}

impl ResponseTranslator {
    pub fn new(model: Arc<ServedModel>, meta: ResponseMeta, stream: bool, include_usage: bool, skip_special: bool, max_message: usize) -> Self {
        ResponseTranslator {
            model,
            meta,
            stream,
            include_usage,
            frames: FrameDecoder::new(max_message),
            decoder: IncrementalDecoder::new(skip_special),
            text: String::new(),
            usage: Usage::default(),
            finish_reason: None,
            role_sent: false,
        }
    }

    /// Feed engine body bytes. Streams return the SSE bytes to send now (possibly empty).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, ApiError> {
        let messages = self.frames.push(chunk).map_err(|e| match e {
            FrameError::Compressed => ApiError::internal("engine sent a compressed message"),
            FrameError::TooLarge(n) => ApiError::internal(format!("engine message of {n} bytes exceeds the limit")),
        })?;
        let mut out = Vec::new();
        for raw in messages {
            let message = GenerateResponse::decode(raw.as_slice())
                .map_err(|e| ApiError::internal(format!("engine sent an undecodable message: {e}")))?;
            match message.response {
                Some(generate_response::Response::Chunk(chunk)) => {
                    self.usage.prompt_tokens = chunk.prompt_tokens;
                    self.usage.cached_tokens = chunk.cached_tokens;
                    self.usage.completion_tokens += chunk.token_ids.len() as u32;
                    self.tokens(&chunk.token_ids, &mut out);
                }
                Some(generate_response::Response::Complete(done)) => {
                    self.usage.prompt_tokens = done.prompt_tokens;
                    self.usage.cached_tokens = done.cached_tokens;
                    // A streamed Complete repeats the last chunk's delta; only a non-streamed one
                    // carries the output.
                    if !self.stream {
                        self.usage.completion_tokens = done.output_ids.len() as u32;
                        self.tokens(&done.output_ids, &mut out);
                    }
                    self.finish_reason = Some(done.finish_reason);
                }
                None => {}
            }
        }
        Ok(out)
    }

    fn tokens(&mut self, ids: &[u32], out: &mut Vec<u8>) {
        let delta = self.decoder.push(&self.model.files.tokenizer, ids);
        self.text_delta(delta, out);
    }

    fn text_delta(&mut self, delta: String, out: &mut Vec<u8>) {
        if !self.stream {
            self.text.push_str(&delta);
            return;
        }
        if !self.role_sent {
            self.role_sent = true;
            chunk_event(&self.meta, json!({"role": "assistant", "content": ""}), None, out);
        }
        if !delta.is_empty() {
            chunk_event(&self.meta, json!({"content": delta}), None, out);
        }
    }

    /// The end of a successful exchange: the final JSON, or the closing events of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = self.decoder.flush(&self.model.files.tokenizer);
        let reason = self.finish_reason.clone().unwrap_or_else(|| "stop".into());
        if !self.stream {
            self.text.push_str(&rest);
            return completion_json(&self.meta, &self.text, &reason, self.usage);
        }
        let mut out = Vec::new();
        self.text_delta(rest, &mut out);
        chunk_event(&self.meta, json!({}), Some(&reason), &mut out);
        if self.include_usage {
            usage_event(&self.meta, self.usage, &mut out);
        }
        out.extend_from_slice(SSE_DONE);
        out
    }

    /// The end of a failed stream whose 200 status already went out.
    pub fn fail_stream(&self, error: &ApiError) -> Vec<u8> {
        let mut out = Vec::new();
        error_event(error, &mut out);
        out.extend_from_slice(SSE_DONE);
        out
    }
}
