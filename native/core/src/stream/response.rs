//! Engine response → client response: gRPC frames to text, OpenAI JSON or SSE, one state per choice.

use std::sync::Arc;

use serde_json::Value;

use crate::detokenize::IncrementalDecoder;
use crate::engine::{Output, Protocol, TokenLogprob};
use crate::error::ApiError;
use crate::gateway::ServedModel;
use crate::grpc_frame::{FrameDecoder, FrameError};
use crate::openai::logprobs::{chat_content, chat_logprobs, CompletionLogprobs};
use crate::openai::request::Api;
use crate::openai::response::{
    choice_value, chunk_event, completion_json, error_event, start_event, usage_event, Delta, ResponseMeta, Usage,
    SSE_DONE,
};
use crate::stop::StopMatcher;
use crate::tokenize::TextTokenizer;

/// How the client wants the answer.
pub struct ResponseShape {
    pub meta: ResponseMeta,
    pub protocol: Protocol,
    pub stream: bool,
    pub include_usage: bool,
    pub skip_special_tokens: bool,
    pub stop: Vec<String>,
    pub include_stop_str_in_output: bool,
    /// Tokens that end a choice (stop token ids, EOS): not part of the text unless
    /// `include_stop_str_in_output`.
    pub stop_token_ids: Vec<u32>,
    /// Completions with `echo`: the prompt's text comes first, in every choice.
    pub echo: Option<String>,
    pub n: u32,
    /// Logprobs with this many top alternatives per token, when asked for.
    pub logprobs: Option<u32>,
}

/// One choice's progress: its own detokenizer, stop matcher, text and logprobs.
struct Choice {
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    /// Non-streamed answers collect their text and logprobs here.
    text: String,
    chat_logprobs: Vec<Value>,
    completion_logprobs: CompletionLogprobs,
    /// Characters of the choice's text so far (completions' `text_offset`).
    offset: usize,
    started: bool,
    finish_reason: Option<String>,
}

/// What the engine has said so far, translated.
pub struct ResponseTranslator {
    model: Arc<ServedModel>,
    shape: ResponseShape,
    frames: FrameDecoder,
    choices: Vec<Choice>,
    pub usage: Usage,
}

impl ResponseTranslator {
    pub fn new(model: Arc<ServedModel>, shape: ResponseShape, max_message: usize) -> Self {
        let echo = shape.echo.clone().unwrap_or_default();
        let choices = (0..shape.n.max(1))
            .map(|_| Choice {
                decoder: IncrementalDecoder::new(shape.skip_special_tokens),
                stop: StopMatcher::new(shape.stop.clone(), shape.include_stop_str_in_output),
                text: if shape.stream { String::new() } else { echo.clone() },
                chat_logprobs: Vec::new(),
                completion_logprobs: CompletionLogprobs::default(),
                offset: 0,
                started: false,
                finish_reason: None,
            })
            .collect();
        ResponseTranslator {
            model,
            shape,
            frames: FrameDecoder::new(max_message),
            choices,
            usage: Usage::default(),
        }
    }

    pub fn stream(&self) -> bool {
        self.shape.stream
    }

    /// Every choice has ended.
    pub fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish_reason.is_some())
    }

    /// The finish reasons, comma-separated in index order, once every choice has ended.
    pub fn finish_reason(&self) -> Option<String> {
        self.all_finished().then(|| {
            let reasons: Vec<&str> = self.choices.iter().filter_map(|c| c.finish_reason.as_deref()).collect();
            reasons.join(",")
        })
    }

    /// Feed engine body bytes. Streams return the SSE bytes to send now (possibly empty).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, ApiError> {
        let messages = self.frames.push(chunk).map_err(|e| match e {
            FrameError::Compressed => ApiError::internal("engine sent a compressed message"),
            FrameError::TooLarge(n) => ApiError::internal(format!("engine message of {n} bytes exceeds the limit")),
        })?;
        let mut out = Vec::new();
        for raw in messages {
            self.push_message(&raw, &mut out)?;
        }
        Ok(out)
    }

    /// Feed one whole engine message (unframed).
    pub fn push_message(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), ApiError> {
        let output = self
            .shape
            .protocol
            .decode_response(raw, self.shape.stream)
            .map_err(|e| ApiError::internal(format!("engine sent an undecodable message: {e}")))?;
        match output {
            Some(output) => self.output(output, out),
            None => Ok(()),
        }
    }

    fn output(&mut self, o: Output, out: &mut Vec<u8>) -> Result<(), ApiError> {
        let n = self.choices.len();
        let choice = self
            .choices
            .get_mut(o.index as usize)
            .ok_or_else(|| ApiError::internal(format!("engine sent choice {} of a request for {n}", o.index)))?;
        self.usage.prompt_tokens = o.prompt_tokens;
        self.usage.cached_tokens = o.cached_tokens;
        self.usage.completion_tokens += o.token_ids.len() as u32;
        if choice.finish_reason.is_some() {
            return Ok(());
        }
        let tokenizer = &self.model.files.tokenizer;
        // Tokens after a stop string the gateway caught are not the client's, nor their logprobs.
        let logprobs: &[TokenLogprob] = if choice.stop.matched().is_some() {
            &[]
        } else {
            &o.logprobs
        };
        let mut ids: &[u32] = &o.token_ids;
        if !self.shape.include_stop_str_in_output {
            if let Some(end) = ids.iter().position(|t| self.shape.stop_token_ids.contains(t)) {
                ids = &ids[..end];
            }
        }
        let delta = choice.decoder.push(tokenizer, ids);
        let mut text = choice.stop.push(&delta);
        let finish = o.finish_reason.map(|reason| {
            text.push_str(&choice.finalize(tokenizer));
            // A stop string the gateway caught is a "stop" whatever the engine said.
            if choice.stop.matched().is_some() || reason.is_empty() {
                "stop".to_string()
            } else {
                reason
            }
        });
        emit(&self.shape, tokenizer, o.index, choice, &text, logprobs, finish, out);
        Ok(())
    }

    /// The end of a successful exchange: the final JSON, or the closing events of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = self.close_choices();
        let meta = &self.shape.meta;
        if !self.shape.stream {
            return completion_json(meta, self.choice_values(), self.usage);
        }
        if self.shape.include_usage {
            usage_event(meta, self.usage, &mut out);
        }
        out.extend_from_slice(SSE_DONE);
        out
    }

    /// End every choice the engine left open (as "stop"); streams return the events that says.
    pub fn close_choices(&mut self) -> Vec<u8> {
        let tokenizer = &self.model.files.tokenizer;
        let mut out = Vec::new();
        for (index, choice) in self.choices.iter_mut().enumerate() {
            if choice.finish_reason.is_none() {
                let tail = choice.finalize(tokenizer);
                emit(
                    &self.shape,
                    tokenizer,
                    index as u32,
                    choice,
                    &tail,
                    &[],
                    Some("stop".into()),
                    &mut out,
                );
            }
        }
        out
    }

    /// The non-streamed choices, in index order.
    pub fn choice_values(&self) -> Vec<Value> {
        let meta = &self.shape.meta;
        self.choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let logprobs = match (self.shape.logprobs, meta.api) {
                    (None, _) => Value::Null,
                    (Some(_), Api::Chat) => chat_logprobs(c.chat_logprobs.clone()),
                    (Some(_), Api::Completion) => c.completion_logprobs.to_value(),
                };
                let reason = c.finish_reason.as_deref().unwrap_or("stop");
                choice_value(meta, i as u32, &c.text, reason, logprobs)
            })
            .collect()
    }

    /// The end of a failed stream whose 200 status already went out.
    pub fn fail_stream(&self, error: &ApiError) -> Vec<u8> {
        let mut out = Vec::new();
        error_event(error, &mut out);
        out.extend_from_slice(SSE_DONE);
        out
    }
}

impl Choice {
    /// The text still held by the detokenizer and the stop matcher at the choice's end.
    fn finalize(&mut self, tokenizer: &TextTokenizer) -> String {
        let rest = self.decoder.flush(tokenizer);
        let mut tail = self.stop.push(&rest);
        tail.push_str(&self.stop.flush());
        tail
    }
}

/// Hand one choice's new text and logprobs to the client (streams) or to the choice (non-streamed).
#[allow(clippy::too_many_arguments)]
fn emit(
    shape: &ResponseShape,
    tokenizer: &TextTokenizer,
    index: u32,
    choice: &mut Choice,
    text: &str,
    logprobs: &[TokenLogprob],
    finish: Option<String>,
    out: &mut Vec<u8>,
) {
    let top = shape.logprobs.unwrap_or(0) as usize;
    let wants_logprobs = shape.logprobs.is_some();
    if !shape.stream {
        choice.text.push_str(text);
        if wants_logprobs {
            match shape.meta.api {
                Api::Chat => choice.chat_logprobs.extend(chat_content(tokenizer, logprobs, top)),
                Api::Completion => choice
                    .completion_logprobs
                    .push(tokenizer, logprobs, top, &mut choice.offset),
            }
        }
        choice.finish_reason = finish;
        return;
    }
    let meta = &shape.meta;
    if !choice.started {
        choice.started = true;
        start_event(meta, index, out);
        if let Some(echo) = &shape.echo {
            let delta = Delta {
                text: Some(echo),
                ..Delta::default()
            };
            chunk_event(meta, index, delta, out);
        }
    }
    let has_logprobs = wants_logprobs && !logprobs.is_empty();
    if text.is_empty() && !has_logprobs && finish.is_none() {
        return;
    }
    let logprobs = match (has_logprobs, meta.api) {
        (false, _) => Value::Null,
        (true, Api::Chat) => chat_logprobs(chat_content(tokenizer, logprobs, top)),
        (true, Api::Completion) => {
            let mut lp = CompletionLogprobs::default();
            lp.push(tokenizer, logprobs, top, &mut choice.offset);
            lp.to_value()
        }
    };
    let delta = Delta {
        text: (!text.is_empty() || meta.api == Api::Completion).then_some(text),
        role: false,
        finish_reason: finish.as_deref(),
        logprobs,
    };
    chunk_event(meta, index, delta, out);
    choice.finish_reason = finish;
}
