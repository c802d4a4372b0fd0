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
    choice_value, chunk_event, completion_json, error_event, start_event, usage_event, Delta, ResponseMeta,
    ToolCallDelta, Usage, SSE_DONE,
};
use crate::stop::StopMatcher;
use crate::stream::output_plan::ParsingPlan;
use crate::stream::parsed_output::{ChoiceOutput, StreamPiece};
use crate::tokenize::TextTokenizer;

/// Where a translator finds the model's tokenizer: the served model (ext_proc) or the model's files
/// alone (the Envoy module, which has no router or templates of its own to keep).
pub trait TokenizerSource: Send + Sync {
    fn tokenizer(&self) -> &TextTokenizer;
}

impl TokenizerSource for ServedModel {
    fn tokenizer(&self) -> &TextTokenizer {
        &self.files.tokenizer
    }
}

impl TokenizerSource for crate::model::ModelFiles {
    fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }
}

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
    /// Chat choices whose text goes through tool-call and reasoning parsers (None: plain text).
    pub parsing: Option<ParsingPlan>,
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
    /// The parsed message, when the choice's text is parsed.
    output: Option<ChoiceOutput>,
}

/// What the engine has said so far, translated.
pub struct ResponseTranslator {
    model: Arc<dyn TokenizerSource>,
    shape: ResponseShape,
    frames: FrameDecoder,
    choices: Vec<Choice>,
    pub usage: Usage,
}

impl ResponseTranslator {
    pub fn new(model: Arc<dyn TokenizerSource>, shape: ResponseShape, max_message: usize) -> Self {
        let echo = shape.echo.clone().unwrap_or_default();
        let choices = (0..shape.n.max(1))
            .map(|_| Choice {
                // Parsed text keeps the special tokens that mark calls and reasoning (the others are
                // dropped before decoding, as `skip_special_tokens` would).
                decoder: IncrementalDecoder::new(shape.skip_special_tokens && shape.parsing.is_none()),
                stop: StopMatcher::new(shape.stop.clone(), shape.include_stop_str_in_output),
                text: if shape.stream { String::new() } else { echo.clone() },
                chat_logprobs: Vec::new(),
                completion_logprobs: CompletionLogprobs::default(),
                offset: 0,
                started: false,
                finish_reason: None,
                output: shape.parsing.as_ref().map(|plan| {
                    ChoiceOutput::new(plan.parser_for(shape.stream), plan.reasoning_parsed)
                        .leaving_out_reasoning(!plan.include_reasoning)
                }),
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
        let mut out = Vec::new();
        // Out of `self` while it hands messages to `push_message` (which needs all of `self`).
        let mut frames = std::mem::replace(&mut self.frames, FrameDecoder::new(0));
        let pushed = frames.push_each(
            chunk,
            |e| match e {
                FrameError::Compressed => ApiError::internal("engine sent a compressed message"),
                FrameError::TooLarge(n) => ApiError::internal(format!("engine message of {n} bytes exceeds the limit")),
            },
            |raw| self.push_message(raw, &mut out),
        );
        self.frames = frames;
        pushed.map(|()| out)
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
        let tokenizer = self.model.tokenizer();
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
        let kept: Vec<u32>;
        if let Some(dropped) = self
            .shape
            .parsing
            .as_ref()
            .and_then(|p| p.dropped_ids(self.shape.skip_special_tokens))
        {
            kept = ids.iter().copied().filter(|id| !dropped.contains(id)).collect();
            ids = &kept;
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
        let tokenizer = self.model.tokenizer();
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
                let parsed = c.output.as_ref().map(|o| &o.message);
                choice_value(meta, i as u32, &c.text, parsed, reason, logprobs)
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
    // Parsed choices: the text becomes reasoning, content and calls; a choice that called tools and
    // ended on its own finished with "tool_calls".
    let mut pieces = Vec::new();
    let mut finish = finish;
    if let Some(output) = choice.output.as_mut() {
        pieces = output.push(text);
        if let Some(reason) = finish.as_mut() {
            pieces.extend(output.finish());
            if reason == "stop" && output.made_calls() {
                *reason = "tool_calls".to_string();
            }
        }
    }
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
    if choice.output.is_none() && text.is_empty() && !has_logprobs && finish.is_none() {
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
    if choice.output.is_some() {
        emit_pieces(meta, index, &pieces, logprobs, finish.as_deref(), out);
        choice.finish_reason = finish;
        return;
    }
    let delta = Delta {
        text: (!text.is_empty() || meta.api == Api::Completion).then_some(text),
        finish_reason: finish.as_deref(),
        logprobs,
        ..Delta::default()
    };
    chunk_event(meta, index, delta, out);
    choice.finish_reason = finish;
}

/// A parsed choice's events: one per piece (the token logprobs ride on the first), then the finish.
fn emit_pieces(
    meta: &ResponseMeta,
    index: u32,
    pieces: &[StreamPiece],
    mut logprobs: Value,
    finish: Option<&str>,
    out: &mut Vec<u8>,
) {
    for piece in pieces {
        let mut delta = Delta {
            logprobs: std::mem::take(&mut logprobs),
            ..Delta::default()
        };
        match piece {
            StreamPiece::Reasoning(text) => delta.reasoning = Some(text),
            StreamPiece::Content(text) => delta.text = Some(text),
            StreamPiece::CallStart { index, id, name } => {
                delta.tool_call = Some(ToolCallDelta::Start {
                    index: *index,
                    id,
                    name,
                })
            }
            StreamPiece::CallArguments { index, fragment } => {
                delta.tool_call = Some(ToolCallDelta::Arguments {
                    index: *index,
                    fragment,
                })
            }
        }
        chunk_event(meta, index, delta, out);
    }
    if finish.is_some() || !logprobs.is_null() {
        let delta = Delta {
            finish_reason: finish,
            logprobs,
            ..Delta::default()
        };
        chunk_event(meta, index, delta, out);
    }
}

#[cfg(test)]
mod tests {
    // The translator over hand-built engine messages: n choices, stop strings per choice, logprobs.

    use std::sync::{Arc, OnceLock};

    use prost::Message;
    use serde_json::Value;

    use super::{ResponseShape, ResponseTranslator};
    use crate::engine::Protocol;
    use crate::gateway::{Gateway, Limits, ServedModel};
    use crate::grpc_frame;
    use crate::openai::request::{parse_chat_request, Api, GenerationRequest, ToolChoice};
    use crate::openai::response::ResponseMeta;
    use crate::pb::{sglang, vllm};
    use crate::routing::RouterConfig;
    use crate::stream::output_plan::{plan, ModelParsers};
    use crate::test_assets::llama3_model_dir;

    /// One model for every test (they run in parallel; the directory is written once).
    fn model() -> Arc<ServedModel> {
        static MODEL: OnceLock<Arc<ServedModel>> = OnceLock::new();
        MODEL.get_or_init(load_model).clone()
    }

    fn load_model() -> Arc<ServedModel> {
        let dir = llama3_model_dir("translator");
        let gateway = Gateway::new(Limits {
            max_body_bytes: 1 << 20,
            max_engine_message: 1 << 20,
            destination_fallbacks: 0,
            max_buffered_output_tokens: crate::gateway::DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
            ..Limits::default()
        });
        gateway
            .add_model("m", &dir, Some(4096), "round_robin", RouterConfig::default())
            .unwrap()
    }

    /// A token that ends a choice in these tests (a stop token id of the request: "!").
    const STOP_TOKEN: u32 = 0;

    fn ids(model: &ServedModel, text: &str) -> Vec<u32> {
        model.files.tokenizer.encode(text).unwrap()
    }

    struct Setup {
        api: Api,
        protocol: Protocol,
        stream: bool,
        n: u32,
        stop: Vec<String>,
        logprobs: Option<u32>,
    }

    impl Default for Setup {
        fn default() -> Self {
            Setup {
                api: Api::Completion,
                protocol: Protocol::Vllm,
                stream: true,
                n: 1,
                stop: Vec::new(),
                logprobs: None,
            }
        }
    }

    fn translator(model: &Arc<ServedModel>, s: Setup) -> ResponseTranslator {
        let shape = ResponseShape {
            meta: ResponseMeta {
                api: s.api,
                id: "cmpl-1".into(),
                created: 1,
                model: "m".into(),
            },
            protocol: s.protocol,
            stream: s.stream,
            include_usage: true,
            skip_special_tokens: true,
            stop: s.stop,
            include_stop_str_in_output: false,
            stop_token_ids: vec![STOP_TOKEN],
            echo: None,
            n: s.n,
            logprobs: s.logprobs,
            parsing: None,
        };
        ResponseTranslator::new(model.clone(), shape, 1 << 20)
    }

    fn lp(ids: &[u32]) -> vllm::OutputLogProbs {
        vllm::OutputLogProbs {
            token_logprobs: ids.iter().map(|&i| -(i as f32) / 1000.0).collect(),
            token_ids: ids.to_vec(),
            top_logprobs: ids
                .iter()
                .map(|&i| vllm::TopLogProbs {
                    values: vec![-0.1, -0.2, -0.3],
                    token_ids: vec![i, i + 1, i + 2],
                })
                .collect(),
        }
    }

    /// The same logprobs as SGLang's message: both engines lay `OutputLogProbs` out alike on the wire.
    fn sglang_lp(lp: vllm::OutputLogProbs) -> sglang::OutputLogProbs {
        sglang::OutputLogProbs::decode(lp.encode_to_vec().as_slice()).unwrap()
    }

    fn chunk(protocol: Protocol, index: u32, tokens: &[u32], logprobs: bool) -> Vec<u8> {
        let output_logprobs = logprobs.then(|| lp(tokens));
        let bytes = match protocol {
            Protocol::Vllm => vllm::GenerateResponse {
                response: Some(vllm::generate_response::Response::Chunk(vllm::GenerateStreamChunk {
                    token_ids: tokens.to_vec(),
                    prompt_tokens: 5,
                    completion_tokens: tokens.len() as u32,
                    cached_tokens: 2,
                    output_logprobs,
                    index,
                })),
            }
            .encode_to_vec(),
            Protocol::Sglang => sglang::GenerateResponse {
                request_id: "r".into(),
                response: Some(sglang::generate_response::Response::Chunk(
                    sglang::GenerateStreamChunk {
                        token_ids: tokens.to_vec(),
                        prompt_tokens: 5,
                        completion_tokens: 99,
                        cached_tokens: 2,
                        output_logprobs: output_logprobs.map(sglang_lp),
                        index,
                    },
                )),
            }
            .encode_to_vec(),
        };
        grpc_frame::encode(&bytes)
    }

    fn complete(protocol: Protocol, index: u32, tokens: &[u32], reason: &str, logprobs: bool) -> Vec<u8> {
        let output_logprobs = logprobs.then(|| lp(tokens));
        let bytes = match protocol {
            Protocol::Vllm => vllm::GenerateResponse {
                response: Some(vllm::generate_response::Response::Complete(vllm::GenerateComplete {
                    output_ids: tokens.to_vec(),
                    finish_reason: reason.into(),
                    prompt_tokens: 5,
                    completion_tokens: tokens.len() as u32,
                    cached_tokens: 2,
                    output_logprobs,
                    index,
                    ..Default::default()
                })),
            }
            .encode_to_vec(),
            Protocol::Sglang => sglang::GenerateResponse {
                request_id: "r".into(),
                response: Some(sglang::generate_response::Response::Complete(
                    sglang::GenerateComplete {
                        output_ids: tokens.to_vec(),
                        finish_reason: reason.into(),
                        prompt_tokens: 5,
                        completion_tokens: tokens.len() as u32,
                        cached_tokens: 2,
                        output_logprobs: output_logprobs.map(sglang_lp),
                        index,
                    },
                )),
            }
            .encode_to_vec(),
        };
        grpc_frame::encode(&bytes)
    }

    fn events(sse: &[u8]) -> Vec<Value> {
        std::str::from_utf8(sse)
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty() && *e != "data: [DONE]")
            .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    /// Streamed text per choice index, and each choice's finish reason.
    fn per_index(events: &[Value], n: usize) -> (Vec<String>, Vec<Option<String>>) {
        let mut texts = vec![String::new(); n];
        let mut reasons = vec![None; n];
        for e in events {
            for c in e["choices"].as_array().unwrap() {
                let i = c["index"].as_u64().unwrap() as usize;
                let text = c["text"]
                    .as_str()
                    .or_else(|| c["delta"]["content"].as_str())
                    .unwrap_or("");
                texts[i].push_str(text);
                if let Some(r) = c["finish_reason"].as_str() {
                    assert!(reasons[i].is_none(), "one finish per choice");
                    reasons[i] = Some(r.to_string());
                }
            }
        }
        (texts, reasons)
    }

    #[test]
    fn n_choices_stream_under_their_own_index_and_usage_sums_them() {
        let m = model();
        for protocol in [Protocol::Vllm, Protocol::Sglang] {
            let mut t = translator(
                &m,
                Setup {
                    protocol,
                    n: 3,
                    ..Setup::default()
                },
            );
            let texts = ["alpha beta", "gamma", "delta epsilon zeta"];
            let tokens: Vec<Vec<u32>> = texts.iter().map(|x| ids(&m, x)).collect();
            let mut sse = Vec::new();
            // Interleaved, one token at a time, choices finishing in a different order than their index.
            let longest = tokens.iter().map(Vec::len).max().unwrap();
            for step in 0..longest {
                for (i, toks) in tokens.iter().enumerate().rev() {
                    if let Some(&tok) = toks.get(step) {
                        sse.extend(t.push(&chunk(protocol, i as u32, &[tok], false)).unwrap());
                        if step + 1 == toks.len() {
                            sse.extend(t.push(&complete(protocol, i as u32, &[tok], "length", false)).unwrap());
                        }
                    }
                }
            }
            assert!(t.all_finished());
            sse.extend(t.finish());
            let evs = events(&sse);
            assert!(evs.iter().all(|e| e["choices"].as_array().unwrap().len() <= 1));
            let (got, reasons) = per_index(&evs, 3);
            assert_eq!(got, texts, "{protocol}");
            assert!(reasons.iter().all(|r| r.as_deref() == Some("length")));
            let usage = &evs.last().unwrap()["usage"];
            let total: usize = tokens.iter().map(Vec::len).sum();
            assert_eq!(usage["completion_tokens"], total as u64, "{protocol}");
            assert_eq!(usage["prompt_tokens"], 5);
            assert_eq!(t.finish_reason().as_deref(), Some("length,length,length"));
        }
    }

    #[test]
    fn non_streamed_choices_come_in_index_order_with_summed_usage() {
        let m = model();
        for protocol in [Protocol::Vllm, Protocol::Sglang] {
            let mut t = translator(
                &m,
                Setup {
                    protocol,
                    stream: false,
                    n: 2,
                    api: Api::Chat,
                    ..Setup::default()
                },
            );
            let (a, b) = (ids(&m, "first answer"), ids(&m, "second"));
            assert!(t.push(&complete(protocol, 1, &b, "stop", false)).unwrap().is_empty());
            assert!(!t.all_finished());
            t.push(&complete(protocol, 0, &a, "length", false)).unwrap();
            let v: Value = serde_json::from_slice(&t.finish()).unwrap();
            let choices = v["choices"].as_array().unwrap();
            assert_eq!(choices.len(), 2);
            assert_eq!(choices[0]["index"], 0);
            assert_eq!(choices[0]["message"]["content"], "first answer");
            assert_eq!(choices[0]["finish_reason"], "length");
            assert_eq!(choices[1]["message"]["content"], "second");
            assert_eq!(choices[1]["finish_reason"], "stop");
            assert!(choices[0]["logprobs"].is_null());
            assert_eq!(v["usage"]["completion_tokens"], (a.len() + b.len()) as u64);
        }
    }

    #[test]
    fn a_choice_index_beyond_n_is_an_engine_error() {
        let m = model();
        let mut t = translator(&m, Setup::default());
        let e = t.push(&chunk(Protocol::Vllm, 1, &[100], false)).unwrap_err();
        assert_eq!(e.status, 500);
    }

    #[test]
    fn stop_strings_are_caught_per_choice_across_chunks() {
        let m = model();
        let mut t = translator(
            &m,
            Setup {
                n: 2,
                stop: vec!["STOP".into()],
                ..Setup::default()
            },
        );
        // Choice 0 says "one STOP two" a token at a time; choice 1 has "S" "TO" without the final "P".
        let zero = ids(&m, "one STOP two");
        let one = ids(&m, "keep STO going");
        let mut sse = Vec::new();
        for i in 0..zero.len().max(one.len()) {
            if let Some(&tok) = zero.get(i) {
                sse.extend(t.push(&chunk(Protocol::Vllm, 0, &[tok], false)).unwrap());
            }
            if let Some(&tok) = one.get(i) {
                sse.extend(t.push(&chunk(Protocol::Vllm, 1, &[tok], false)).unwrap());
            }
        }
        sse.extend(t.push(&complete(Protocol::Vllm, 0, &[], "length", false)).unwrap());
        sse.extend(t.push(&complete(Protocol::Vllm, 1, &[], "length", false)).unwrap());
        sse.extend(t.finish());
        let (texts, reasons) = per_index(&events(&sse), 2);
        assert_eq!(texts, ["one ", "keep STO going"]);
        assert_eq!(reasons, [Some("stop".to_string()), Some("length".to_string())]);
    }

    #[test]
    fn chat_logprobs_have_openai_shape_streamed_and_not() {
        let m = model();
        let tokens = ids(&m, "Hi there");
        for stream in [true, false] {
            let mut t = translator(
                &m,
                Setup {
                    api: Api::Chat,
                    protocol: Protocol::Sglang,
                    stream,
                    logprobs: Some(2),
                    ..Setup::default()
                },
            );
            let mut out = Vec::new();
            if stream {
                for &tok in &tokens {
                    out.extend(t.push(&chunk(Protocol::Sglang, 0, &[tok], true)).unwrap());
                }
                out.extend(t.push(&complete(Protocol::Sglang, 0, &tokens, "stop", true)).unwrap());
            } else {
                t.push(&complete(Protocol::Sglang, 0, &tokens, "stop", true)).unwrap();
            }
            out.extend(t.finish());
            let content: Vec<Value> = if stream {
                events(&out)
                    .iter()
                    .flat_map(|e| e["choices"].as_array().unwrap().clone())
                    .filter(|c| !c["logprobs"].is_null())
                    .flat_map(|c| c["logprobs"]["content"].as_array().unwrap().clone())
                    .collect()
            } else {
                let v: Value = serde_json::from_slice(&out).unwrap();
                v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone()
            };
            assert_eq!(content.len(), tokens.len(), "stream={stream}");
            let text: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
            assert_eq!(text, "Hi there");
            for (entry, &id) in content.iter().zip(&tokens) {
                let token = entry["token"].as_str().unwrap();
                let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
                assert_eq!(bytes, token.as_bytes());
                assert!((entry["logprob"].as_f64().unwrap() + id as f64 / 1000.0).abs() < 1e-4);
                let top = entry["top_logprobs"].as_array().unwrap();
                assert_eq!(top.len(), 2, "top_logprobs=2 alternatives");
                assert_eq!(top[0]["token"], token);
                assert!(top[1]["bytes"].is_array());
            }
        }
    }

    #[test]
    fn completion_logprobs_have_parallel_lists_and_text_offsets() {
        let m = model();
        let tokens = ids(&m, "Hello big world");
        let mut t = translator(
            &m,
            Setup {
                stream: false,
                logprobs: Some(1),
                ..Setup::default()
            },
        );
        t.push(&complete(Protocol::Vllm, 0, &tokens, "length", true)).unwrap();
        let v: Value = serde_json::from_slice(&t.finish()).unwrap();
        let lp = &v["choices"][0]["logprobs"];
        let strs: Vec<&str> = lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert_eq!(strs.concat(), "Hello big world");
        let offsets: Vec<u64> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
        let mut expected = Vec::new();
        let mut at = 0;
        for s in &strs {
            expected.push(at);
            at += s.chars().count() as u64;
        }
        assert_eq!(offsets, expected);
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
        for (top, s) in lp["top_logprobs"].as_array().unwrap().iter().zip(&strs) {
            let top = top.as_object().unwrap();
            assert!(top.contains_key(*s), "the sampled token is among its alternatives");
            assert!(top.len() <= 2);
        }
    }

    /// A chat request with one tool and `tool_choice` set (as w5-req's validation sets it).
    fn tool_request(choice: ToolChoice) -> GenerationRequest {
        let body = serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        });
        let mut req = parse_chat_request(&serde_json::to_vec(&body).unwrap()).unwrap();
        req.tool_choice = choice;
        req
    }

    fn parsed_translator(m: &Arc<ServedModel>, stream: bool, n: u32, req: &GenerationRequest) -> ResponseTranslator {
        let mut t = translator(
            m,
            Setup {
                api: Api::Chat,
                stream,
                n,
                ..Setup::default()
            },
        );
        t.shape.parsing = plan(m, req, false);
        assert!(t.shape.parsing.is_some());
        // The parsers are made per choice at construction: make them again with the plan.
        ResponseTranslator::new(m.clone(), t.shape, 1 << 20)
    }

    const CALLS: &str = r#"[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}]"#;

    /// The message a stream's deltas add up to, per choice: content, reasoning and calls by index.
    fn streamed_messages(events: &[Value], n: usize) -> (Vec<Value>, Vec<Option<String>>) {
        let mut messages = vec![serde_json::json!({"content": "", "tool_calls": []}); n];
        let mut reasons = vec![None; n];
        for e in events {
            for c in e["choices"].as_array().unwrap() {
                let i = c["index"].as_u64().unwrap() as usize;
                let delta = &c["delta"];
                if let Some(text) = delta["content"].as_str() {
                    let m = &mut messages[i];
                    m["content"] = (m["content"].as_str().unwrap().to_string() + text).into();
                }
                for call in delta["tool_calls"].as_array().into_iter().flatten() {
                    let index = call["index"].as_u64().unwrap() as usize;
                    let calls = messages[i]["tool_calls"].as_array_mut().unwrap();
                    if index == calls.len() {
                        // A call's first delta: id, type and name, with empty arguments.
                        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
                        assert_eq!(call["type"], "function");
                        assert_eq!(call["function"]["arguments"], "");
                        calls.push(call.clone());
                    } else {
                        assert!(
                            call.get("id").is_none() && call["function"].get("name").is_none(),
                            "{call}"
                        );
                        let args = calls[index]["function"]["arguments"].as_str().unwrap().to_string();
                        let fragment = call["function"]["arguments"].as_str().unwrap();
                        calls[index]["function"]["arguments"] = (args + fragment).into();
                    }
                }
                if let Some(r) = c["finish_reason"].as_str() {
                    reasons[i] = Some(r.to_string());
                }
            }
        }
        (messages, reasons)
    }

    /// A call without its id (ids differ between answers) and with its arguments parsed.
    fn call_shape(call: &Value) -> Value {
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        serde_json::json!({"type": call["type"], "name": call["function"]["name"], "arguments": args})
    }

    #[test]
    fn forced_tool_calls_have_openai_shape_when_not_streamed() {
        let m = model();
        let mut t = parsed_translator(&m, false, 1, &tool_request(ToolChoice::Required));
        t.push(&complete(Protocol::Vllm, 0, &ids(&m, CALLS), "stop", false))
            .unwrap();
        let v: Value = serde_json::from_slice(&t.finish()).unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        let message = &choice["message"];
        assert_eq!(message["role"], "assistant");
        assert!(message["content"].is_null(), "only calls: content is null");
        assert!(message.get("reasoning_content").is_none(), "no reasoning parser");
        let calls = message["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        for call in calls {
            let id = call["id"].as_str().unwrap();
            assert_eq!(id.len(), "call_".len() + 24);
            assert!(id["call_".len()..].bytes().all(|b| b.is_ascii_alphanumeric()));
        }
        assert_ne!(calls[0]["id"], calls[1]["id"]);
        assert_eq!(
            call_shape(&calls[0]),
            serde_json::json!({"type": "function", "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})
        );
        assert!(
            calls[1]["function"]["arguments"].is_string(),
            "arguments are a JSON string"
        );
    }

    #[test]
    fn streamed_tool_calls_add_up_to_the_non_streamed_message_per_choice() {
        let m = model();
        let req = tool_request(ToolChoice::Named("get_weather".into()));
        let one = r#"{"name": "get_weather", "parameters": {"city": "Lyon"}}"#;
        let texts = [CALLS, one];
        let mut whole = parsed_translator(&m, false, 2, &tool_request(ToolChoice::Required));
        let mut streamed = parsed_translator(&m, true, 2, &req);
        let tokens: Vec<Vec<u32>> = texts.iter().map(|x| ids(&m, x)).collect();
        let mut sse = Vec::new();
        for (i, toks) in tokens.iter().enumerate() {
            whole
                .push(&complete(Protocol::Vllm, i as u32, toks, "stop", false))
                .unwrap();
        }
        let longest = tokens.iter().map(Vec::len).max().unwrap();
        for step in 0..longest {
            for (i, toks) in tokens.iter().enumerate() {
                if let Some(&tok) = toks.get(step) {
                    sse.extend(streamed.push(&chunk(Protocol::Vllm, i as u32, &[tok], false)).unwrap());
                    if step + 1 == toks.len() {
                        sse.extend(
                            streamed
                                .push(&complete(Protocol::Vllm, i as u32, &[], "stop", false))
                                .unwrap(),
                        );
                    }
                }
            }
        }
        sse.extend(streamed.finish());
        let evs = events(&sse);
        // A call's start comes before any of its arguments, and the first event of each choice names the role.
        let (messages, reasons) = streamed_messages(&evs, 2);
        assert_eq!(
            reasons,
            [Some("tool_calls".to_string()), Some("tool_calls".to_string())]
        );
        let v: Value = serde_json::from_slice(&whole.finish()).unwrap();
        for (i, message) in messages.iter().enumerate() {
            let expected = &v["choices"][i]["message"];
            assert_eq!(message["content"], "", "no content streamed");
            assert!(expected["content"].is_null());
            let got: Vec<Value> = message["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(call_shape)
                .collect();
            let want: Vec<Value> = expected["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(call_shape)
                .collect();
            assert_eq!(got, want, "choice {i}");
        }
        assert_eq!(messages[0]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(messages[1]["tool_calls"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_call_cut_short_by_the_length_limit_finishes_with_length() {
        let m = model();
        for stream in [false, true] {
            let mut t = parsed_translator(&m, stream, 1, &tool_request(ToolChoice::Required));
            let cut = &CALLS[..40];
            let tokens = ids(&m, cut);
            let mut out = Vec::new();
            if stream {
                out.extend(t.push(&chunk(Protocol::Vllm, 0, &tokens, false)).unwrap());
            }
            out.extend(t.push(&complete(Protocol::Vllm, 0, &tokens, "length", false)).unwrap());
            out.extend(t.finish());
            if stream {
                // The stream sent the name as soon as `"parameters": {` arrived: the call stays, with
                // the fragments sent; none of its text is content.
                let (messages, reasons) = streamed_messages(&events(&out), 1);
                assert_eq!(messages[0]["content"], "");
                let call = &messages[0]["tool_calls"][0]["function"];
                assert_eq!(call["name"], "get_weather");
                assert_eq!(call["arguments"], "{");
                assert_eq!(reasons[0].as_deref(), Some("length"));
            } else {
                let v: Value = serde_json::from_slice(&out).unwrap();
                assert_eq!(v["choices"][0]["message"]["content"], cut);
                assert!(v["choices"][0]["message"].get("tool_calls").is_none());
                assert_eq!(v["choices"][0]["finish_reason"], "length");
            }
        }
    }

    #[test]
    fn parsed_text_keeps_marker_special_tokens_and_drops_the_others() {
        let dir = crate::test_assets::llama31_model_dir("markers");
        let m = Gateway::new(Limits::default())
            .add_model("m", &dir, Some(4096), "round_robin", RouterConfig::default())
            .unwrap();
        // <|python_tag|> marks Llama's calls; <|start_header_id|> is no format's marker.
        let text = "<|python_tag|>hi<|start_header_id|> there";
        let tokens = ids(&m, text);
        assert!(tokens.contains(&m.files.tokenizer.token_to_id("<|python_tag|>").unwrap()));
        let mut t = parsed_translator(&m, false, 1, &tool_request(ToolChoice::Required));
        t.push(&complete(Protocol::Vllm, 0, &tokens, "stop", false)).unwrap();
        let v: Value = serde_json::from_slice(&t.finish()).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "<|python_tag|>hi there");
        // Unparsed chat drops every special token, as before.
        let mut t = translator(
            &m,
            Setup {
                api: Api::Chat,
                stream: false,
                ..Setup::default()
            },
        );
        t.push(&complete(Protocol::Vllm, 0, &tokens, "stop", false)).unwrap();
        let v: Value = serde_json::from_slice(&t.finish()).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "hi there");
    }

    #[test]
    fn only_chat_requests_with_something_to_parse_are_parsed() {
        let m = model();
        // The Llama 3 tokenizer alone (no template, a plain name) infers no format.
        assert_eq!(m.parsers(), ModelParsers::default());
        assert!(plan(&m, &tool_request(ToolChoice::Auto), false).is_none());
        assert!(plan(&m, &tool_request(ToolChoice::None), false).is_none());
        assert!(plan(&m, &tool_request(ToolChoice::Required), false).is_some());
        let mut completion = tool_request(ToolChoice::Required);
        completion.api = Api::Completion;
        assert!(plan(&m, &completion, false).is_none());
    }

    /// A model whose answers go through the Hermes tool parser and `<think>` reasoning.
    fn hermes_think_model() -> Arc<ServedModel> {
        let dir = llama3_model_dir("hermes-think");
        let m = Gateway::new(Limits::default())
            .add_model("m", &dir, Some(4096), "round_robin", RouterConfig::default())
            .unwrap();
        m.set_parsers(Some("hermes"), Some("think")).unwrap();
        m
    }

    /// The answer to `req` of a model saying `text`, whole and streamed a token at a time.
    fn whole_and_streamed(
        m: &Arc<ServedModel>,
        req: &GenerationRequest,
        text: &str,
        opens_think: bool,
    ) -> (Value, Value) {
        let tokens = ids(m, text);
        let make = |stream| {
            let mut t = translator(
                m,
                Setup {
                    api: Api::Chat,
                    stream,
                    ..Setup::default()
                },
            );
            t.shape.parsing = plan(m, req, opens_think);
            ResponseTranslator::new(m.clone(), t.shape, 1 << 20)
        };
        let mut whole = make(false);
        whole
            .push(&complete(Protocol::Vllm, 0, &tokens, "stop", false))
            .unwrap();
        let whole: Value = serde_json::from_slice(&whole.finish()).unwrap();
        let mut streamed = make(true);
        let mut sse = Vec::new();
        for &tok in &tokens {
            sse.extend(streamed.push(&chunk(Protocol::Vllm, 0, &[tok], false)).unwrap());
        }
        sse.extend(streamed.push(&complete(Protocol::Vllm, 0, &[], "stop", false)).unwrap());
        sse.extend(streamed.finish());
        let evs = events(&sse);
        let mut reasoning = String::new();
        for e in &evs {
            let delta = &e["choices"][0]["delta"];
            assert_eq!(delta["reasoning"], delta["reasoning_content"]);
            reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        }
        let (mut messages, reasons) = streamed_messages(&evs, 1);
        messages[0]["reasoning"] = reasoning.into();
        messages[0]["finish_reason"] = reasons[0].clone().into();
        (whole["choices"][0].clone(), messages.remove(0))
    }

    #[test]
    fn text_reasoning_and_calls_stream_as_they_come_whole() {
        let m = hermes_think_model();
        let text = "<think>The user wants weather.</think>Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\nDone.";
        let (whole, streamed) = whole_and_streamed(&m, &tool_request(ToolChoice::Auto), text, false);
        let message = &whole["message"];
        assert_eq!(whole["finish_reason"], "tool_calls");
        assert_eq!(message["reasoning_content"], "The user wants weather.");
        assert_eq!(message["reasoning"], message["reasoning_content"]);
        let content = message["content"].as_str().unwrap();
        assert!(
            content.starts_with("Sure.") && content.trim_end().ends_with("Done."),
            "{content:?}"
        );
        assert!(!content.contains('<'), "no markup in content: {content:?}");
        let calls = message["tool_calls"].as_array().unwrap();
        assert_eq!(
            call_shape(&calls[0]),
            serde_json::json!({"type": "function", "name": "get_weather", "arguments": {"city": "Paris"}})
        );
        // The stream adds up to the same message.
        assert_eq!(streamed["content"], message["content"]);
        assert_eq!(streamed["reasoning"], message["reasoning_content"]);
        assert_eq!(streamed["finish_reason"], "tool_calls");
        let got: Vec<Value> = streamed["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(call_shape)
            .collect();
        assert_eq!(got, calls.iter().map(call_shape).collect::<Vec<_>>());
    }

    #[test]
    fn reasoning_starts_in_the_think_block_the_prompt_opened_and_is_off_when_asked() {
        let m = hermes_think_model();
        let plain = |kwargs: Value| {
            let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs});
            parse_chat_request(&serde_json::to_vec(&body).unwrap()).unwrap()
        };
        let (whole, streamed) = whole_and_streamed(&m, &plain(serde_json::json!({})), "Thinking.</think>Hello.", true);
        assert_eq!(whole["message"]["reasoning_content"], "Thinking.");
        assert_eq!(whole["message"]["content"], "Hello.");
        assert_eq!(whole["finish_reason"], "stop");
        assert!(whole["message"].get("tool_calls").is_none());
        assert_eq!(
            (streamed["reasoning"].as_str(), streamed["content"].as_str()),
            (Some("Thinking."), Some("Hello."))
        );
        // No tools: the tool parser is off, the text of a call is content.
        let (whole, _) = whole_and_streamed(&m, &plain(serde_json::json!({})), "<tool_call>x</tool_call>", false);
        assert_eq!(whole["message"]["content"], "<tool_call>x</tool_call>");
        assert!(
            whole["message"]["reasoning_content"].is_null(),
            "a reasoning parser ran: null, not absent"
        );
        // Thinking turned off: nothing is reasoning.
        let off = plain(serde_json::json!({"enable_thinking": false}));
        assert!(plan(&m, &off, false).is_none());
    }

    #[test]
    fn unknown_parser_names_are_refused_with_the_known_ones() {
        let m = hermes_think_model();
        let e = m.set_parsers(Some("nope"), None).unwrap_err();
        assert!(e.contains("hermes") && e.contains("none, auto"), "{e}");
        assert!(m.set_parsers(Some("none"), Some("auto")).is_ok());
    }

    #[test]
    fn a_stop_token_ends_the_text_without_being_part_of_it() {
        let m = model();
        for stream in [true, false] {
            let mut t = translator(
                &m,
                Setup {
                    stream,
                    ..Setup::default()
                },
            );
            let mut tokens = ids(&m, "all done");
            tokens.push(STOP_TOKEN);
            let mut out = Vec::new();
            if stream {
                out.extend(t.push(&chunk(Protocol::Vllm, 0, &tokens, false)).unwrap());
                out.extend(
                    t.push(&complete(Protocol::Vllm, 0, &[STOP_TOKEN], "stop", false))
                        .unwrap(),
                );
            } else {
                t.push(&complete(Protocol::Vllm, 0, &tokens, "stop", false)).unwrap();
            }
            out.extend(t.finish());
            let text = if stream {
                per_index(&events(&out), 1).0.remove(0)
            } else {
                let v: Value = serde_json::from_slice(&out).unwrap();
                v["choices"][0]["text"].as_str().unwrap().to_string()
            };
            assert_eq!(text, "all done", "stream={stream}");
            assert_eq!(
                t.usage.completion_tokens,
                tokens.len() as u32,
                "the stop token still counts"
            );
        }
    }
}
