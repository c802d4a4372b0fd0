//! Engine response → client response: gRPC frames to text, OpenAI JSON or SSE.

use std::sync::Arc;

use prost::Message;

use crate::detokenize::IncrementalDecoder;
use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::grpc_frame::{FrameDecoder, FrameError};
use crate::openai::response::{
    completion_json, error_event, finish_event, start_event, text_event, usage_event, ResponseMeta, Usage, SSE_DONE,
};
use crate::pb::vllm::{generate_response, GenerateResponse};
use crate::stop::StopMatcher;

/// How the client wants the answer.
pub struct ResponseShape {
    pub meta: ResponseMeta,
    pub stream: bool,
    pub include_usage: bool,
    pub skip_special_tokens: bool,
    pub stop: StopMatcher,
    /// Completions with `echo`: the prompt's text comes first.
    pub echo: Option<String>,
}

/// What the engine has said so far, translated.
pub struct ResponseTranslator {
    model: Arc<ServedModel>,
    shape: ResponseShape,
    frames: FrameDecoder,
    decoder: IncrementalDecoder,
    /// Non-streamed answers collect their text here.
    text: String,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    started: bool,
}

impl ResponseTranslator {
    pub fn new(model: Arc<ServedModel>, shape: ResponseShape, max_message: usize) -> Self {
        let decoder = IncrementalDecoder::new(shape.skip_special_tokens);
        let text = shape.echo.clone().filter(|_| !shape.stream).unwrap_or_default();
        ResponseTranslator {
            model,
            shape,
            frames: FrameDecoder::new(max_message),
            decoder,
            text,
            usage: Usage::default(),
            finish_reason: None,
            started: false,
        }
    }

    pub fn stream(&self) -> bool {
        self.shape.stream
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
                    if !self.shape.stream {
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
        let visible = self.shape.stop.push(&delta);
        self.emit(&visible, out);
    }

    fn emit(&mut self, text: &str, out: &mut Vec<u8>) {
        if !self.shape.stream {
            self.text.push_str(text);
            return;
        }
        if !self.started {
            self.started = true;
            start_event(&self.shape.meta, out);
            if let Some(echo) = self.shape.echo.take() {
                text_event(&self.shape.meta, &echo, out);
            }
        }
        if !text.is_empty() {
            text_event(&self.shape.meta, text, out);
        }
    }

    /// The end of a successful exchange: the final JSON, or the closing events of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = self.decoder.flush(&self.model.files.tokenizer);
        let mut tail = self.shape.stop.push(&rest);
        tail.push_str(&self.shape.stop.flush());
        // A stop string the gateway caught is a "stop" whatever the engine said.
        let reason = match (self.shape.stop.matched(), &self.finish_reason) {
            (Some(_), _) => "stop".to_string(),
            (None, Some(reason)) => reason.clone(),
            (None, None) => "stop".to_string(),
        };
        let mut out = Vec::new();
        self.emit(&tail, &mut out);
        if !self.shape.stream {
            return completion_json(&self.shape.meta, &self.text, &reason, self.usage);
        }
        finish_event(&self.shape.meta, &reason, &mut out);
        if self.shape.include_usage {
            usage_event(&self.shape.meta, self.usage, &mut out);
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
