//! The per-request ext_proc state machine.
//!
//! Envoy sends `ProcessingRequest`s (request headers, body chunks, response headers, body chunks,
//! trailers) over one bidi stream per HTTP request; `RequestStream::process` takes each one and returns
//! the `ProcessingResponse`s to send, in the order Envoy requires: the request-headers reply only after
//! the whole body is parsed (it carries the routing decision), before any body reply; the
//! response-headers reply before any response body; trailers last.

mod answers;
mod batch;
mod deadline;
mod engine_id;
pub mod engine_outcome;
mod epp;
mod forced_calls;
mod gateway_call;
mod health_answer;
mod http_api;
mod local_reply;
mod observe;
pub mod output_plan;
mod parsed_output;
mod replies;
mod request;
pub mod response;
pub mod response_plan;
mod target;
pub mod trace;

#[cfg(test)]
mod failover_tests;
#[cfg(test)]
mod observability_tests;
#[cfg(test)]
mod shutdown_tests;

use std::sync::Arc;
use std::time::Instant;

use crate::auth::{model_not_allowed, Grant};
use crate::contracts::{AUTHORIZATION_HEADER, OBJECTIVE_HEADER, REQUEST_ID_HEADER, SESSION_HEADER};
use crate::engine::{GenerateCall, Protocol};
use crate::error::ApiError;
use crate::gateway::{unix_now, Gateway, ServedModel};
use crate::grpc_frame;
use crate::metrics::Phase as Step;
use crate::openai::request::{parse_chat_request, parse_completion_request, Api, GenerationRequest, PromptInput};
use crate::openai::response::ResponseMeta;
use crate::openai::tokenize::{parse_detokenize_request, parse_tokenize_request};
use crate::pb::ext_proc::{
    processing_request::Request, HeaderMap, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use crate::routing::{Failure, PickRequest};
use http_api::HttpApi;
use response::{ResponseShape, ResponseTranslator};
use response_plan::ResponsePlan;
use target::Target;

pub use batch::{CallOutcome, FanoutCall};
pub use deadline::{CallClock, Deadlines, Missed};
pub use engine_id::next as new_engine_request_id;
pub use gateway_call::GatewayCall;
pub use replies::MAX_BODY_CHUNK;
pub use target::grpc_outcome;

/// Request bodies smaller than this are processed where their stream is served: tokenizing 32 KiB
/// takes a few milliseconds, about what handing it to a worker and back costs.
pub const INLINE_BODY_BYTES: usize = 32 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
    ResponseBody,
    /// Envoy's own reply to a request that was never routed, passed through (`local_reply`).
    LocalReply,
    /// A batch's engine calls are made by the server (`take_fanout`, then `fanout_done`).
    Fanout,
    /// The Responses API's routes are served by the server itself (`take_job`, then `job_done`).
    Job,
    Done,
}

/// What the request became, for logs and metrics once the stream ends.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// The client's `x-request-id` (Envoy's or the client's own), as the client sees it echoed.
    pub request_id: String,
    /// The id the engine knows the request by (a batch's: the prefix of its prompts' `<id>-<i>`); empty
    /// until the request is routed.
    pub engine_request_id: String,
    pub path: String,
    pub model: String,
    /// The engine address the request went to (a batch's: each prompt's, comma-separated).
    pub endpoint: String,
    /// The data-parallel rank the request was pinned to, on an engine of several.
    pub dp_rank: Option<u32>,
    pub status: u16,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub finish_reason: String,
    pub error: String,
    /// The `x-gateway-inference-objective` header (empty without one).
    pub objective: String,
    /// The priority the objective has under the model's router settings (0 until the model is known).
    pub priority: i32,
    /// The name of the API key the request came with (empty without keys configured).
    pub api_key: String,
    /// The request's trace, when tracing is on (`Gateway::set_tracing`).
    pub trace: Option<trace::TraceContext>,
    /// When its phases happened (wall clock).
    pub timings: trace::Timings,
}

/// An engine request to abort: the engine's address, its protocol and the request's id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingAbort<'a> {
    pub endpoint: &'a str,
    pub protocol: Protocol,
    pub request_id: &'a str,
}

/// The engine call in flight, once the request was routed.
struct Exchange {
    model: Arc<ServedModel>,
    prompt_tokens: u64,
    target: Target,
    engine_request_id: String,
    translator: ResponseTranslator,
    client_headers_sent: bool,
    /// The call's first-token and inter-token deadlines.
    clock: CallClock,
    /// The Envoy module translates this call's response (`Limits::response_in_envoy`): extproc sees its
    /// headers and trailers only.
    in_envoy: bool,
}

pub struct RequestStream {
    gateway: Arc<Gateway>,
    phase: Phase,
    api: Option<HttpApi>,
    /// `x-session-id`: the consistent-hash key, if the client sent one.
    session: Option<String>,
    /// `x-gateway-inference-objective`: names the request's priority class, if the client sent one.
    objective: Option<String>,
    /// Envoy's subset hint: the engines this request may go to (`None`: any).
    subset: Option<Vec<String>>,
    /// The client's request headers the engine call must not carry (credentials, cookies, deadlines...).
    headers_removed: Vec<String>,
    /// The API key's grant, when keys are configured.
    grant: Option<Arc<Grant>>,
    body: Vec<u8>,
    exchange: Option<Exchange>,
    batch: Option<batch::Batch>,
    /// A request for the Responses API, until the server takes it.
    job: Option<crate::responses::api::Job>,
    /// The full `:path` (with its query) and `:method`, for the routes that read them.
    full_path: String,
    method: String,
    summary: Summary,
    /// When the engine's first output came (for the time to first token).
    first_output: Option<Instant>,
    /// What the Envoy module said the answer came to (`Limits::response_in_envoy`).
    module_outcome: Option<response_plan::ResponseOutcome>,
    /// The Envoy module answers this stream's client: `Limits::response_in_envoy`, or the Envoy in front
    /// said so (`contracts::RESPONSE_PATH_METADATA`, `answered_in_envoy`).
    response_in_envoy: bool,
}

impl RequestStream {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        RequestStream {
            phase: Phase::RequestHeaders,
            api: None,
            session: None,
            objective: None,
            subset: None,
            headers_removed: Vec::new(),
            grant: None,
            body: Vec::new(),
            exchange: None,
            batch: None,
            job: None,
            full_path: String::new(),
            method: String::new(),
            summary: Summary::default(),
            first_output: None,
            module_outcome: None,
            response_in_envoy: gateway.limits.response_in_envoy,
            gateway,
        }
    }

    /// The Envoy in front runs the response module (its ext_proc stream carries
    /// `contracts::RESPONSE_PATH_METADATA`): routed calls leave their plan for it and extproc follows only
    /// the response's headers and trailers.
    pub fn answered_in_envoy(&mut self) {
        self.response_in_envoy = true;
    }

    /// One ext_proc message in, the replies to send out, in order.
    pub fn process(&mut self, request: ProcessingRequest) -> Vec<ProcessingResponse> {
        match (self.phase, request.request) {
            (Phase::RequestHeaders, Some(Request::RequestHeaders(h))) => {
                self.subset = epp::subset_hint(request.metadata_context.as_ref());
                self.on_request_headers(h)
            }
            (Phase::RequestBody, Some(Request::RequestBody(b))) => self.on_request_body(b),
            // Trailers after the body also end it (a client sending HTTP trailers).
            (Phase::RequestBody, Some(Request::RequestTrailers(_))) => self.forward(),
            (Phase::ResponseHeaders, Some(Request::ResponseHeaders(h))) => {
                self.follow_upstream(epp::served_endpoint(
                    request.metadata_context.as_ref(),
                    &request.attributes,
                ));
                self.on_response_headers(h)
            }
            (Phase::ResponseBody, Some(Request::ResponseBody(b))) => self.on_response_body(b),
            (Phase::ResponseBody, Some(Request::ResponseTrailers(t))) => {
                self.on_response_trailers(t.trailers.unwrap_or_default())
            }
            // Envoy's own reply (a timeout, a codec error) before the request was routed.
            (Phase::RequestHeaders | Phase::RequestBody | Phase::LocalReply, Some(request)) => {
                match local_reply::pass_through(&request) {
                    Some((out, ended)) => {
                        self.phase = if ended { Phase::Done } else { Phase::LocalReply };
                        out
                    }
                    None => Vec::new(),
                }
            }
            // Envoy may repeat an end-of-stream body chunk on large bodies; anything after the end
            // of a phase is dropped, never processed twice.
            _ => Vec::new(),
        }
    }

    /// The engine request to abort if the stream ends now (the client went away mid-exchange).
    pub fn pending_abort(&self) -> Option<PendingAbort<'_>> {
        match (&self.exchange, self.phase) {
            (Some(x), Phase::ResponseHeaders | Phase::ResponseBody) => Some(PendingAbort {
                endpoint: &x.target.address,
                protocol: x.target.protocol,
                request_id: &x.engine_request_id,
            }),
            // The Envoy module ended the answer early: the engine may still be generating.
            (Some(x), Phase::Done) if self.module_cut() => Some(PendingAbort {
                endpoint: &x.target.address,
                protocol: x.target.protocol,
                request_id: &x.engine_request_id,
            }),
            _ => None,
        }
    }

    /// The Envoy module said it ended the answer at the inter-token deadline.
    fn module_timed_out(&self) -> bool {
        self.module_outcome.as_ref().is_some_and(|o| o.timed_out)
    }

    /// The Envoy module said it ended the answer before the engine finished.
    fn module_cut(&self) -> bool {
        self.module_outcome.as_ref().is_some_and(|o| o.timed_out || o.cut)
    }

    /// What the request became so far.
    pub fn summary(&self) -> Summary {
        let mut s = self.summary.clone();
        if let Some(x) = &self.exchange {
            s.endpoint = x.target.address.clone();
            s.dp_rank = x.target.dp_rank;
            s.prompt_tokens = x.translator.usage.prompt_tokens;
            s.completion_tokens = x.translator.usage.completion_tokens;
            s.cached_tokens = x.translator.usage.cached_tokens;
            s.finish_reason = x.translator.finish_reason().unwrap_or_default();
        }
        if let Some(o) = &self.module_outcome {
            s.status = o.status;
            s.prompt_tokens = o.prompt_tokens;
            s.completion_tokens = o.completion_tokens;
            s.cached_tokens = o.cached_tokens;
            s.finish_reason = o.finish_reason.clone();
            s.error = o.error.clone();
        }
        if s.timings.finished_ns == 0 {
            s.timings.finished_ns = trace::now_ns();
        }
        s
    }

    /// The engine calls of a batched request, for the server to make (once); `fanout_done` takes the
    /// outcomes.
    pub fn take_fanout(&mut self) -> Option<Vec<FanoutCall>> {
        let calls = self.batch.as_mut()?.take_calls();
        (!calls.is_empty()).then_some(calls)
    }

    /// The batch's answer (an immediate response) from its calls' outcomes, in call order.
    pub fn fanout_done(&mut self, outcomes: Vec<CallOutcome>) -> Vec<ProcessingResponse> {
        let Some(mut batch) = self.batch.take().filter(|_| self.phase == Phase::Fanout) else {
            return Vec::new();
        };
        match batch.answer(outcomes) {
            Ok((body, usage)) => {
                self.summary.prompt_tokens = usage.prompt_tokens;
                self.summary.completion_tokens = usage.completion_tokens;
                self.summary.cached_tokens = usage.cached_tokens;
                self.answer(body, "extproc_batch")
            }
            Err(error) => self.fail(error),
        }
    }

    /// A Responses API request for the server to serve (once); `job_done` takes its answer.
    pub fn take_job(&mut self) -> Option<crate::responses::api::Job> {
        self.job.take()
    }

    /// A part of the Responses API's streamed answer: the stream's start (a streamed immediate response's
    /// headers, in reply to the request headers), then events.
    pub fn job_piece(&mut self, piece: crate::responses::api::Piece) -> Vec<ProcessingResponse> {
        use crate::responses::api::Piece;
        if self.phase != Phase::Job {
            return Vec::new();
        }
        match piece {
            Piece::Start => vec![replies::local_stream_headers(
                200,
                "text/event-stream",
                &self.summary.request_id,
            )],
            Piece::Body(body) if body.is_empty() => Vec::new(),
            Piece::Body(body) => replies::local_stream_body(&body, false),
        }
    }

    /// The Responses API's answer: an immediate response, or the last chunk of a streamed one.
    pub fn job_done(&mut self, answer: crate::responses::api::Answer) -> Vec<ProcessingResponse> {
        if self.phase != Phase::Job {
            return Vec::new();
        }
        self.phase = Phase::Done;
        self.summary.status = answer.status;
        self.summary.model = answer.model;
        self.summary.endpoint = answer.endpoint;
        self.summary.prompt_tokens = answer.usage.prompt_tokens;
        self.summary.completion_tokens = answer.usage.completion_tokens;
        self.summary.cached_tokens = answer.usage.cached_tokens;
        self.summary.error = answer.error;
        if answer.streamed {
            return replies::local_stream_body(&answer.body, true);
        }
        vec![replies::immediate(
            answer.status,
            answer.content_type,
            answer.body,
            &self.summary.request_id,
            "extproc_responses",
        )]
    }

    /// Hands the request to the server's Responses API (`take_job`).
    fn start_job(&mut self, body: Vec<u8>) -> Vec<ProcessingResponse> {
        self.job = Some(crate::responses::api::Job {
            method: std::mem::take(&mut self.method),
            path: std::mem::take(&mut self.full_path),
            body,
            request_id: self.summary.request_id.clone(),
            session: self.session.clone(),
            objective: self.objective.clone(),
            subset: self.subset.clone(),
            grant: self.grant.clone(),
        });
        self.phase = Phase::Job;
        Vec::new()
    }

    /// The replies that end the exchange when the server stops before it is over (its grace ran out):
    /// a stream whose 200 already went out gets an error event and `data: [DONE]` as the end of its
    /// body, a request whose answer has not started gets a 503 (an immediate response: Envoy refuses an
    /// unprompted response-headers reply), a request not yet routed nothing (the caller ends the
    /// ext_proc stream with an error, which Envoy answers with its 503). The machine is done after it:
    /// take `pending_abort` first.
    pub fn shutdown(&mut self) -> Vec<ProcessingResponse> {
        if self.exchange.is_none() || !matches!(self.phase, Phase::ResponseHeaders | Phase::ResponseBody) {
            return Vec::new();
        }
        self.end_early(ApiError::unavailable("the gateway is shutting down"))
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Whether `request` completes a request body large enough that processing it (parse, template,
    /// tokenize) belongs on the server's worker pool rather than the thread serving the connection.
    pub fn is_heavy(&self, request: &ProcessingRequest) -> bool {
        if self.phase != Phase::RequestBody {
            return false;
        }
        match &request.request {
            Some(Request::RequestBody(b)) => b.end_of_stream && self.body.len() + b.body.len() >= INLINE_BODY_BYTES,
            Some(Request::RequestTrailers(_)) => self.body.len() >= INLINE_BODY_BYTES,
            _ => false,
        }
    }

    /// Answer the client directly with `error`; nothing reaches an engine.
    fn fail(&mut self, error: ApiError) -> Vec<ProcessingResponse> {
        self.phase = Phase::Done;
        self.summary.status = error.status;
        self.summary.error = error.message.clone();
        vec![replies::immediate_error(&error, &self.summary.request_id)]
    }

    fn on_request_headers(&mut self, h: HttpHeaders) -> Vec<ProcessingResponse> {
        let headers = h.headers.unwrap_or_default();
        self.summary.timings.received_ns = trace::now_ns();
        if self.gateway.tracing() {
            self.summary.trace = Some(trace::TraceContext::start(headers.get(trace::TRACEPARENT_HEADER)));
        }
        self.summary.request_id = headers.get(REQUEST_ID_HEADER).unwrap_or_default().to_string();
        self.session = headers.get(SESSION_HEADER).map(str::to_string);
        self.objective = headers
            .get(OBJECTIVE_HEADER)
            .filter(|o| !o.is_empty())
            .map(str::to_string);
        self.summary.objective = self.objective.clone().unwrap_or_default();
        let method = headers.get(":method").unwrap_or_default();
        let full_path = headers.get(":path").unwrap_or_default();
        let path = full_path.split('?').next().unwrap_or_default().to_string();
        self.summary.path = path.clone();
        // Load balancers probe without a key: /health is answered before keys are checked.
        if HttpApi::from_path(&path) == Some(HttpApi::Health) && method == "GET" {
            return self.health(&headers);
        }
        // Keys are checked before anything else is looked at, let alone an engine called.
        if let Some(keys) = self.gateway.api_keys() {
            match keys.authorize(headers.get(AUTHORIZATION_HEADER), Instant::now()) {
                Ok(grant) => {
                    self.summary.api_key = grant.name.clone();
                    self.grant = Some(grant);
                }
                Err(error) => return self.fail(error),
            }
        }
        self.headers_removed = replies::headers_not_for_engine(headers.headers.iter().map(|h| h.key.as_str()));
        let Some(api) = HttpApi::from_path(&path) else {
            return self.fail(ApiError::not_found(format!("no route for {path}")));
        };
        self.api = Some(api);
        self.method = method.to_string();
        self.full_path = full_path.to_string();
        if api != HttpApi::Responses && method != api.method() {
            return self.fail(method_not_allowed(method, &path));
        }
        match api {
            HttpApi::Models => {
                let body = answers::models(&self.gateway, self.grant.as_deref());
                self.answer(body, "extproc_models")
            }
            HttpApi::Health => self.health(&headers),
            HttpApi::Responses if h.end_of_stream => self.start_job(Vec::new()),
            _ if h.end_of_stream => self.fail(ApiError::invalid("a JSON request body is required")),
            _ => {
                self.phase = Phase::RequestBody;
                Vec::new()
            }
        }
    }

    /// `GET /health`: 200 when every model has a ready engine, else 503 with the reason.
    fn health(&mut self, headers: &HeaderMap) -> Vec<ProcessingResponse> {
        let viewer = match self.gateway.api_keys() {
            None => health_answer::Viewer::Anyone,
            Some(keys) => match keys.authorize(headers.get(AUTHORIZATION_HEADER), Instant::now()) {
                Ok(grant) => health_answer::Viewer::Key(grant),
                Err(_) => health_answer::Viewer::Unknown,
            },
        };
        let (status, body) = health_answer::answer(&self.gateway, &viewer);
        self.phase = Phase::Done;
        self.summary.status = status;
        vec![replies::immediate(
            status,
            "application/json",
            body,
            &self.summary.request_id,
            "extproc_health",
        )]
    }

    /// A 200 JSON answer from the gateway itself.
    fn answer(&mut self, body: Vec<u8>, details: &str) -> Vec<ProcessingResponse> {
        self.phase = Phase::Done;
        self.summary.status = 200;
        vec![replies::immediate(
            200,
            "application/json",
            body,
            &self.summary.request_id,
            details,
        )]
    }

    fn on_request_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        let limit = self.gateway.limits.max_body_bytes;
        if self.body.len() + b.body.len() > limit {
            return self.fail(ApiError::new(
                413,
                "invalid_request_error",
                format!("request body exceeds {limit} bytes"),
            ));
        }
        self.body.extend_from_slice(&b.body);
        if b.end_of_stream {
            self.forward()
        } else {
            Vec::new()
        }
    }

    /// The whole body is in: turn it into the engine call, or answer with the error.
    fn forward(&mut self) -> Vec<ProcessingResponse> {
        self.summary.timings.body_ns = trace::now_ns();
        match self.prepare() {
            Ok(replies) => replies,
            Err(error) => self.fail(error),
        }
    }

    fn model(&mut self, name: &str) -> Result<Arc<ServedModel>, ApiError> {
        self.summary.model = name.to_string();
        if let Some(grant) = &self.grant {
            // A key learns nothing of the models it may not use: they answer as unknown ones do.
            if !grant.allows(name) || self.gateway.model(name).is_none() {
                return Err(model_not_allowed(name));
            }
        }
        self.gateway.model(name).ok_or_else(|| {
            let mut e = ApiError::not_found(format!("The model '{name}' does not exist."));
            e.param = Some("model".into());
            e
        })
    }

    fn prepare(&mut self) -> Result<Vec<ProcessingResponse>, ApiError> {
        let body = std::mem::take(&mut self.body);
        match self.api {
            Some(HttpApi::ChatCompletions) => {
                let began = Instant::now();
                let req = parse_chat_request(&body);
                Step::Parse.observe(began);
                self.generate(req?)
            }
            Some(HttpApi::Completions) => {
                let began = Instant::now();
                let req = parse_completion_request(&body);
                Step::Parse.observe(began);
                self.generate(req?)
            }
            Some(HttpApi::Tokenize) => {
                let req = parse_tokenize_request(&body)?;
                let answer = answers::tokenize(&*self.model(&req.model)?, &req)?;
                Ok(self.answer(answer, "extproc_tokenize"))
            }
            Some(HttpApi::Detokenize) => {
                let req = parse_detokenize_request(&body)?;
                let answer = answers::detokenize(&*self.model(&req.model)?, &req)?;
                Ok(self.answer(answer, "extproc_detokenize"))
            }
            Some(HttpApi::Responses) => Ok(self.start_job(body)),
            Some(HttpApi::Models | HttpApi::Health) | None => Err(ApiError::internal("no body was expected")),
        }
    }

    fn generate(&mut self, req: GenerationRequest) -> Result<Vec<ProcessingResponse>, ApiError> {
        self.summary.timings.parsed_ns = trace::now_ns();
        let model = self.model(&req.model)?;
        let subset: Option<Vec<&str>> = self.subset.as_ref().map(|s| s.iter().map(String::as_str).collect());
        let objective = self.objective.as_deref();
        self.summary.priority = model.router.priority(objective);
        let routing = PickRequest {
            session_key: self.session.as_deref().or(req.user.as_deref()),
            subset: subset.as_deref(),
            objective,
            ..PickRequest::default()
        };
        let engine_request_id = engine_id::next();
        self.summary.engine_request_id = engine_request_id.clone();
        // A batch's answer is always sent whole.
        let prompts = match &req.input {
            PromptInput::Batch(prompts) => Some(prompts.len()),
            _ => (!req.stream).then_some(1),
        };
        if let Some(prompts) = prompts {
            let budget = self.gateway.limits.max_buffered_output_tokens;
            request::check_output_budget(&model, &req, prompts, budget)?;
        }
        if let PromptInput::Batch(prompts) = &req.input {
            let limit = self.gateway.limits.max_engine_message;
            let deadlines = self.gateway.limits.deadlines;
            let batch = batch::Batch::new(&model, &req, prompts, &engine_request_id, routing, limit, deadlines)?;
            self.summary.endpoint = batch.endpoints();
            self.batch = Some(batch);
            self.phase = Phase::Fanout;
            return Ok(Vec::new());
        }
        let prompt = request::prompt(&model, &req.input)?;
        request::check_context(&model, prompt.input_ids.len(), &req)?;
        self.summary.timings.tokenized_ns = trace::now_ns();
        let target = target::pick(
            &model,
            PickRequest {
                token_ids: &prompt.input_ids,
                ..routing
            },
        )?;
        let encoding = Instant::now();
        let prompt_tokens = prompt.input_ids.len() as u64;
        let parsing = output_plan::plan(&model, &req, prompt.opens_think);
        let echo = req.echo.then(|| model.files.tokenizer.decode(&prompt.input_ids, false));
        let generate = target.protocol.encode_generate(GenerateCall {
            request_id: &engine_request_id,
            input_ids: prompt.input_ids,
            sampling: &req.sampling,
            constraint: req.constraint.as_ref(),
            include_stop_str_in_output: req.include_stop_str_in_output,
            stream: req.stream,
            data_parallel_rank: target.dp_rank,
        });

        let prefix = if req.api == Api::Chat { "chatcmpl" } else { "cmpl" };
        let shape = ResponseShape {
            meta: ResponseMeta {
                api: req.api,
                id: format!("{prefix}-{engine_request_id}"),
                created: unix_now(),
                model: model.name.clone(),
            },
            protocol: target.protocol,
            stream: req.stream,
            include_usage: req.include_usage,
            skip_special_tokens: req.sampling.skip_special_tokens,
            stop: req.sampling.stop.clone(),
            include_stop_str_in_output: req.include_stop_str_in_output,
            stop_token_ids: request::stop_token_ids(&model, &req),
            echo,
            n: req.sampling.n,
            logprobs: req.sampling.logprobs,
            parsing,
        };
        let max_message = self.gateway.limits.max_engine_message;
        let in_envoy = self.response_in_envoy;
        let inter_token = self.gateway.limits.deadlines.inter_token;
        let plan = in_envoy.then(|| {
            ResponsePlan::of(&shape, max_message, &self.summary.request_id)
                .with_inter_token(inter_token)
                .to_json()
        });
        let translator = ResponseTranslator::new(model.clone(), shape, max_message);
        // Envoy connects to the engine's address; the rank travels in the request.
        let destination = target.destination(self.gateway.limits.destination_fallbacks);
        self.summary.timings.routed_ns = trace::now_ns();
        let mut out = vec![replies::route_to_engine(
            &destination,
            target.protocol.generate_path(),
            &self.headers_removed,
        )];
        if let Some(trace) = &self.summary.trace {
            trace.add_to(&mut out[0]);
        }
        if let Some(plan) = &plan {
            replies::add_response_plan(&mut out[0], plan);
        }
        out.extend(replies::body_chunks(&grpc_frame::encode(&generate), true, true));
        Step::Encode.observe(encoding);
        let deadlines = self.gateway.limits.deadlines;
        let clock = if req.stream {
            CallClock::streamed(deadlines, Instant::now())
        } else {
            let room = (model.max_context() as u64).saturating_sub(prompt_tokens) as u32;
            CallClock::whole(deadlines, req.sampling.max_tokens.unwrap_or(room), Instant::now())
        };
        self.exchange = Some(Exchange {
            model,
            prompt_tokens,
            target,
            engine_request_id,
            translator,
            client_headers_sent: false,
            clock,
            in_envoy,
        });
        self.phase = Phase::ResponseHeaders;
        Ok(out)
    }

    /// Envoy reports which engine answered: after a fallback it is not the one picked, and aborts,
    /// load accounting and logs must follow it. Addresses are compared (another rank of the picked
    /// engine is never a fallback); on a fallback with data-parallel ranks the request counts on the
    /// rank it is pinned to (a fallback has it), else on rank 0.
    fn follow_upstream(&mut self, upstream: Option<&str>) {
        let Some(exchange) = self.exchange.as_mut() else { return };
        if let Some(upstream) = upstream.filter(|u| *u != exchange.target.address) {
            // Envoy retries only after a failed connection, a reset or UNAVAILABLE: the pick is down.
            exchange.target.report(&exchange.model, Err(Failure::Down));
            exchange
                .target
                .follow(&exchange.model, upstream, exchange.prompt_tokens);
        }
    }

    fn on_response_headers(&mut self, h: HttpHeaders) -> Vec<ProcessingResponse> {
        if self.exchange.as_ref().is_some_and(|x| x.in_envoy) {
            return self.on_module_response_headers();
        }
        let headers = h.headers.unwrap_or_default();
        let status = headers.get(":status").unwrap_or_default();
        let ended = engine_outcome::headers_error(
            status,
            headers.get("grpc-status"),
            headers.get("grpc-message"),
            h.end_of_stream,
        );
        if let Some((error, outcome)) = ended {
            self.report(outcome);
            return self.fail(error);
        }
        // The client headers wait until the first content (streams) or the outcome (non-streamed)
        // is known, so an early engine error can still get its own status code.
        self.phase = Phase::ResponseBody;
        Vec::new()
    }

    fn on_response_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        let exchange = self.exchange.as_mut().expect("an exchange exists after routing");
        // The engine's first bytes mean its prefill is done: the router stops counting it as backlog.
        if let Some(in_flight) = exchange.target.in_flight.as_mut() {
            in_flight.first_token();
        }
        if !b.body.is_empty() {
            if self.summary.timings.first_token_ns == 0 {
                self.summary.timings.first_token_ns = trace::now_ns();
            }
            if exchange.clock.waiting_first() {
                exchange.target.report(&exchange.model, Ok(())); // it is alive: any penalty ends
                self.first_output.get_or_insert_with(Instant::now);
            }
            exchange.clock.progress(Instant::now());
        }
        let decoding = Instant::now();
        let pushed = exchange.translator.push(&b.body);
        Step::Decode.observe(decoding);
        let events = match pushed {
            Ok(events) => events,
            Err(error) => return self.finish(Some(error)),
        };
        if b.end_of_stream {
            // The engine closed the body without trailers: the end, and the call's outcome is unknown.
            let error = engine_outcome::unfinished_error(&exchange.translator);
            return self.finish(error);
        }
        if events.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if !exchange.client_headers_sent {
            exchange.client_headers_sent = true;
            out.push(replies::client_headers(
                200,
                "text/event-stream",
                &self.summary.request_id,
            ));
        }
        out.extend(replies::body_chunks(&events, false, false));
        out
    }

    /// The Envoy module answers the client: the engine has begun (its prefill is done, the router stops
    /// counting it as backlog and any penalty ends); extproc waits for the trailers, which say the call
    /// is over (a stream that ends before them is a client gone away: the server aborts the call).
    fn on_module_response_headers(&mut self) -> Vec<ProcessingResponse> {
        let exchange = self.exchange.as_mut().expect("an exchange exists after routing");
        if let Some(in_flight) = exchange.target.in_flight.as_mut() {
            in_flight.first_token();
        }
        exchange.target.report(&exchange.model, Ok(()));
        self.summary.timings.first_token_ns = trace::now_ns();
        self.first_output.get_or_insert_with(Instant::now);
        self.phase = Phase::ResponseBody;
        vec![replies::pass_response_headers()]
    }

    fn on_response_trailers(&mut self, trailers: HeaderMap) -> Vec<ProcessingResponse> {
        if let Some(exchange) = self.exchange.as_mut().filter(|x| x.in_envoy) {
            exchange.target.in_flight = None;
            self.phase = Phase::Done;
            self.summary.status = 200;
            // What the module says the answer came to, into the summary (logs and metrics).
            self.module_outcome = trailers
                .get(response_plan::OUTCOME_TRAILER)
                .and_then(|json| serde_json::from_str::<response_plan::ResponseOutcome>(json).ok());
            if self.module_timed_out() {
                // The module ended a stalled stream: penalise the endpoint as `time_out` does; the call
                // stays in `pending_abort`, so the server aborts it.
                self.report(Some(Err(Failure::Down)));
            }
            return vec![replies::remove_outcome_trailer()];
        }
        let exchange = self.exchange.as_ref().expect("an exchange exists after routing");
        let (error, outcome) = engine_outcome::trailers_error(
            trailers.get("grpc-status"),
            trailers.get("grpc-message"),
            &exchange.translator,
        );
        self.report(outcome);
        self.finish(error)
    }

    /// Tell the router how the engine call ended (`None`: nothing to tell).
    fn report(&self, outcome: Option<Result<(), Failure>>) {
        if let (Some(x), Some(outcome)) = (&self.exchange, outcome) {
            x.target.report(&x.model, outcome);
        }
    }

    /// When the engine call times out unless the engine sends something (`None`: no call waiting).
    pub fn deadline(&self) -> Option<Instant> {
        match (&self.exchange, self.phase) {
            // Once the Envoy module has the response, extproc can no longer end it.
            (Some(x), Phase::ResponseBody) if x.in_envoy => None,
            (Some(x), Phase::ResponseHeaders | Phase::ResponseBody) => x.clock.deadline(),
            _ => None,
        }
    }

    /// The engine call missed its deadline at `now` (`deadline()` passed): the client hears it (a 504,
    /// or an SSE error event and `data: [DONE]` once its 200 went out), the endpoint is penalised. Take
    /// `pending_abort` first: the engine call must still be aborted. Nothing when no deadline was missed.
    pub fn time_out(&mut self, now: Instant) -> Vec<ProcessingResponse> {
        if self.deadline().is_none() {
            return Vec::new();
        }
        let Some(missed) = self.exchange.as_ref().and_then(|x| x.clock.missed(now)) else {
            return Vec::new();
        };
        self.report(Some(Err(Failure::Down)));
        self.end_early(ApiError::new(504, "timeout", missed.message()))
    }

    /// End the exchange before the engine did: a stream whose 200 went out gets the error as an SSE
    /// event and `data: [DONE]` (no trailers reply: Envoy sends no trailers before the end, and an
    /// unprompted one is refused), any other request the error status as an immediate response (Envoy
    /// refuses an unprompted response-headers reply).
    fn end_early(&mut self, error: ApiError) -> Vec<ProcessingResponse> {
        let headers_sent = self.exchange.as_ref().is_some_and(|x| x.client_headers_sent);
        if headers_sent {
            let mut replies = self.finish(Some(error));
            replies.pop();
            replies
        } else {
            if let Some(x) = self.exchange.as_mut() {
                x.target.in_flight = None;
            }
            self.fail(error)
        }
    }

    /// The last replies of an exchange: client headers if still owed, the final body, the trailers.
    fn finish(&mut self, error: Option<ApiError>) -> Vec<ProcessingResponse> {
        self.phase = Phase::Done;
        let request_id = self.summary.request_id.clone();
        let exchange = self.exchange.as_mut().expect("an exchange exists after routing");
        exchange.target.in_flight = None;
        let mut out = Vec::new();
        let ending = engine_outcome::ending(&mut exchange.translator, error.as_ref(), exchange.client_headers_sent);
        if let Some((status, content_type)) = ending.headers {
            out.push(replies::client_headers(status, content_type, &request_id));
        }
        self.summary.status = ending.status;
        let body = ending.body;
        exchange.client_headers_sent = true;
        if let Some(e) = error {
            self.summary.error = e.message;
        }
        out.extend(replies::body_chunks(&body, true, false));
        out.push(replies::strip_grpc_trailers());
        out
    }
}

fn method_not_allowed(method: &str, path: &str) -> ApiError {
    ApiError::new(
        405,
        "invalid_request_error",
        format!("method {method} not allowed on {path}"),
    )
}

#[cfg(test)]
mod tests {
    // Data-parallel ranks through the stream: the destination names engine addresses only, the rank
    // travels in the Generate request (`data_parallel_rank`), fallbacks are other engines.

    use std::collections::HashSet;
    use std::sync::Arc;

    use prost::Message;

    use super::RequestStream;
    use crate::contracts::{DESTINATION_HEADER, LB_METADATA_NAMESPACE, MAX_RETRIES_HEADER};
    use crate::engine::Protocol;
    use crate::gateway::{Gateway, Limits};
    use crate::pb::ext_proc::{
        body_mutation::Mutation, processing_request::Request, processing_response::Response, HeaderMap, HeaderValue,
        HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    };
    use crate::pb::structs::value::Kind;
    use crate::pb::{sglang, vllm};
    use crate::routing::RouterConfig;
    use crate::test_assets::llama3_model_dir;

    const A: &str = "10.0.0.1:50051";
    const B: &str = "10.0.0.2:50051";
    const C: &str = "10.0.0.3:50051";

    /// A gateway serving model "m" (the venv's Llama 3 tokenizer) that lists up to 4 fallbacks.
    fn gateway() -> Arc<Gateway> {
        let dir = llama3_model_dir("dp");
        let gateway = Arc::new(Gateway::new(Limits {
            max_body_bytes: 1 << 20,
            max_engine_message: 1 << 20,
            destination_fallbacks: 4,
            max_buffered_output_tokens: crate::gateway::DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
            ..Limits::default()
        }));
        gateway
            .add_model("m", &dir, Some(4096), "round_robin", RouterConfig::default())
            .unwrap();
        gateway
    }

    /// What the stream sent for one completion request.
    struct Routed {
        header: String,
        /// Envoy's retry limit for the request: one retry per listed fallback.
        max_retries: usize,
        metadata: String,
        generate: Vec<u8>,
        summary_endpoint: String,
        summary_rank: Option<u32>,
    }

    fn send(gateway: &Arc<Gateway>) -> Routed {
        let mut stream = RequestStream::new(gateway.clone());
        let header = |key: &str, value: &str| HeaderValue {
            key: key.into(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        };
        let headers = ProcessingRequest {
            request: Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![header(":method", "POST"), header(":path", "/v1/completions")],
                }),
                end_of_stream: false,
            })),
            ..Default::default()
        };
        assert!(stream.process(headers).is_empty());
        let body = ProcessingRequest {
            request: Some(Request::RequestBody(HttpBody {
                body: br#"{"model": "m", "prompt": "Hello there", "max_tokens": 4}"#.to_vec(),
                end_of_stream: true,
            })),
            ..Default::default()
        };
        let replies: Vec<ProcessingResponse> = stream.process(body);
        let Some(Response::RequestHeaders(h)) = &replies[0].response else {
            panic!("expected the routing reply, got {:?}", replies[0]);
        };
        let mutation = h.response.as_ref().unwrap().header_mutation.as_ref().unwrap();
        let set = |key: &str| {
            mutation
                .set_headers
                .iter()
                .filter_map(|o| o.header.as_ref())
                .find(|h| h.key == key)
                .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
                .unwrap()
        };
        let header = set(DESTINATION_HEADER);
        let max_retries = set(MAX_RETRIES_HEADER).parse().unwrap();
        let lb = &replies[0].dynamic_metadata.as_ref().unwrap().fields[LB_METADATA_NAMESPACE];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!("envoy.lb is a struct")
        };
        let metadata = lb.fields[DESTINATION_HEADER].as_str().unwrap().to_string();
        let mut framed = Vec::new();
        for r in &replies[1..] {
            if let Some(Response::RequestBody(b)) = &r.response {
                let mutation = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
                if let Some(Mutation::StreamedResponse(s)) = &mutation.mutation {
                    framed.extend_from_slice(&s.body);
                }
            }
        }
        let summary = stream.summary();
        Routed {
            header,
            max_retries,
            metadata,
            generate: framed[5..].to_vec(),
            summary_endpoint: summary.endpoint,
            summary_rank: summary.dp_rank,
        }
    }

    fn data_parallel_rank(protocol: Protocol, generate: &[u8]) -> Option<i32> {
        match protocol {
            Protocol::Vllm => vllm::GenerateRequest::decode(generate).unwrap().data_parallel_rank,
            Protocol::Sglang => sglang::GenerateRequest::decode(generate).unwrap().data_parallel_rank,
        }
    }

    #[test]
    fn ranks_travel_in_the_request_and_the_destination_names_addresses() {
        for protocol in [Protocol::Vllm, Protocol::Sglang] {
            let gateway = gateway();
            let model = gateway.model("m").unwrap();
            // A and B have two ranks each, C one: five endpoints, round robin over them.
            model
                .set_endpoints(vec![
                    (A.into(), 0, protocol, 2),
                    (B.into(), 0, protocol, 2),
                    (C.into(), 0, protocol, 1),
                ])
                .unwrap();
            let mut seen = HashSet::new();
            for _ in 0..10 {
                let routed = send(&gateway);
                assert_eq!(routed.header, routed.metadata);
                assert!(!routed.header.contains('#'), "{}", routed.header);
                let mut destination = routed.header.split(',');
                let primary = destination.next().unwrap();
                let fallbacks: Vec<&str> = destination.collect();
                assert_eq!(routed.summary_endpoint, primary);
                let rank = data_parallel_rank(protocol, &routed.generate);
                assert_eq!(rank.map(|r| r as u32), routed.summary_rank);
                assert_eq!(routed.max_retries, fallbacks.len(), "Envoy retries once per fallback");
                let distinct: HashSet<&str> = fallbacks.iter().copied().collect();
                assert_eq!(distinct.len(), fallbacks.len(), "fallbacks are distinct: {fallbacks:?}");
                assert!(
                    !fallbacks.contains(&primary),
                    "not the primary's engine: {}",
                    routed.header
                );
                if primary == C {
                    assert_eq!(rank, None, "a one-rank engine gets no rank");
                    assert_eq!(distinct, HashSet::from([A, B]));
                } else {
                    assert!(matches!(rank, Some(0 | 1)), "{rank:?}");
                    let other = if primary == A { B } else { A };
                    assert_eq!(fallbacks, [other], "only the other engine with that rank");
                }
                seen.insert((primary.to_string(), rank));
            }
            assert_eq!(seen.len(), 5, "every rank and C were picked: {seen:?}");
        }
    }

    // Request identity, headers and API keys through the stream.

    /// One request through a fresh stream: its headers, then `body` (if any); every reply.
    fn exchange(
        gateway: &Arc<Gateway>,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> (RequestStream, Vec<ProcessingResponse>) {
        let mut stream = RequestStream::new(gateway.clone());
        let headers = headers
            .iter()
            .map(|(k, v)| HeaderValue {
                key: k.to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect();
        let mut replies = stream.process(ProcessingRequest {
            request: Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap { headers }),
                end_of_stream: body.is_none(),
            })),
            ..Default::default()
        });
        if let (Some(body), true) = (body, replies.is_empty()) {
            replies = stream.process(ProcessingRequest {
                request: Some(Request::RequestBody(HttpBody {
                    body: body.to_vec(),
                    end_of_stream: true,
                })),
                ..Default::default()
            });
        }
        (stream, replies)
    }

    const COMPLETION: &[u8] = br#"{"model": "m", "prompt": "Hello there", "max_tokens": 4}"#;

    fn post(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut headers = vec![(":method", "POST"), (":path", "/v1/completions")];
        headers.extend_from_slice(extra);
        headers
    }

    fn engine_request_id(replies: &[ProcessingResponse]) -> String {
        let mut framed = Vec::new();
        for r in replies {
            if let Some(Response::RequestBody(b)) = &r.response {
                let mutation = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
                if let Some(Mutation::StreamedResponse(s)) = &mutation.mutation {
                    framed.extend_from_slice(&s.body);
                }
            }
        }
        vllm::GenerateRequest::decode(&framed[5..]).unwrap().request_id
    }

    /// The immediate response's status and JSON body.
    fn immediate(replies: &[ProcessingResponse]) -> (i32, serde_json::Value) {
        let Some(Response::ImmediateResponse(r)) = &replies[0].response else {
            panic!("expected an immediate response, got {:?}", replies[0]);
        };
        (
            r.status.as_ref().unwrap().code,
            serde_json::from_slice(&r.body).unwrap(),
        )
    }

    fn routed_gateway() -> Arc<Gateway> {
        let gateway = gateway();
        let model = gateway.model("m").unwrap();
        model.set_endpoints(vec![(A.into(), 0, Protocol::Vllm, 1)]).unwrap();
        gateway
    }

    #[test]
    fn engine_request_ids_are_unique_whatever_the_client_sends() {
        let gateway = routed_gateway();
        let mut ids = HashSet::new();
        for extra in [
            &[("x-request-id", "same")][..],
            &[("x-request-id", "same")][..],
            &[][..],
            &[][..],
        ] {
            let (stream, replies) = exchange(&gateway, &post(extra), Some(COMPLETION));
            let id = engine_request_id(&replies);
            assert_ne!(id, "same");
            let summary = stream.summary();
            assert_eq!(summary.engine_request_id, id);
            // The client's id stays the request's id for the client, logs and summaries.
            assert_eq!(summary.request_id, extra.first().map_or("", |h| h.1));
            assert!(ids.insert(id), "an engine request id was reused");
        }
    }

    #[test]
    fn client_headers_other_than_the_engines_are_removed_from_the_engine_call() {
        let gateway = routed_gateway();
        let extra = [
            ("authorization", "Bearer secret"),
            ("cookie", "session=1"),
            ("grpc-timeout", "1S"),
            ("x-request-id", "r-1"),
        ];
        let (_, replies) = exchange(&gateway, &post(&extra), Some(COMPLETION));
        let Some(Response::RequestHeaders(h)) = &replies[0].response else {
            panic!("not routed")
        };
        let removed = &h
            .response
            .as_ref()
            .unwrap()
            .header_mutation
            .as_ref()
            .unwrap()
            .remove_headers;
        for name in ["authorization", "cookie", "grpc-timeout"] {
            assert!(removed.iter().any(|r| r == name), "{name} reaches the engine");
        }
        assert!(!removed.iter().any(|r| r == "x-request-id" || r.starts_with(':')));
    }

    #[test]
    fn empty_completion_prompts_never_reach_an_engine() {
        let gateway = routed_gateway();
        for body in [
            &br#"{"model": "m", "prompt": ""}"#[..],
            br#"{"model": "m", "prompt": ["a", ""]}"#,
        ] {
            let (_, replies) = exchange(&gateway, &post(&[]), Some(body));
            let (status, body) = immediate(&replies);
            assert_eq!((status, body["error"]["param"].as_str()), (400, Some("prompt")));
        }
    }

    #[test]
    fn api_keys_are_checked_before_the_body() {
        use crate::auth::{key_digest_hex, ApiKeys, KeyEntry};
        let gateway = routed_gateway();
        let entry = |key: &str, name: &str, models: &[&str], rpm| KeyEntry {
            sha256: key_digest_hex(key),
            name: name.into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            requests_per_minute: rpm,
        };
        gateway.set_api_keys(Some(
            ApiKeys::new(vec![entry("sk-a", "a", &["m"], 0), entry("sk-b", "b", &["other"], 1)]).unwrap(),
        ));
        // No key, a wrong one: 401 at the headers, the body never read.
        for extra in [&[][..], &[("authorization", "Bearer sk-x")][..]] {
            let (_, replies) = exchange(&gateway, &post(extra), None);
            let (status, body) = immediate(&replies);
            assert_eq!((status, body["error"]["code"].as_str()), (401, Some("invalid_api_key")));
        }
        let (stream, replies) = exchange(&gateway, &post(&[("authorization", "Bearer sk-a")]), Some(COMPLETION));
        assert!(matches!(replies[0].response, Some(Response::RequestHeaders(_))));
        assert_eq!(stream.summary().api_key, "a");
        // b may not use "m": it looks like a model that does not exist, and /v1/models hides it.
        let (_, replies) = exchange(&gateway, &post(&[("authorization", "Bearer sk-b")]), Some(COMPLETION));
        let (status, body) = immediate(&replies);
        assert_eq!((status, body["error"]["code"].as_str()), (404, Some("model_not_found")));
        let models = [
            (":method", "GET"),
            (":path", "/v1/models"),
            ("authorization", "Bearer sk-a"),
        ];
        let (_, replies) = exchange(&gateway, &models, None);
        assert_eq!(immediate(&replies).1["data"].as_array().unwrap().len(), 1);
        // b's one request a minute is spent: 429 with retry-after.
        let (_, replies) = exchange(&gateway, &post(&[("authorization", "Bearer sk-b")]), None);
        let Some(Response::ImmediateResponse(r)) = &replies[0].response else {
            panic!("not refused")
        };
        assert_eq!(r.status.as_ref().unwrap().code, 429);
        let retry_after = r
            .headers
            .as_ref()
            .unwrap()
            .set_headers
            .iter()
            .filter_map(|o| o.header.as_ref());
        let retry_after: Vec<_> = retry_after.filter(|h| h.key == "retry-after").collect();
        assert_eq!(retry_after.len(), 1);
    }
}
