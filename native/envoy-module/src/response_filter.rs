//! The response filter: the engine's gRPC response to the client's OpenAI answer, inside Envoy, with the
//! core's own response side (`extproc_core::stream::response`, `engine_outcome`): frames → engine outputs
//! → detokenized text → stop strings → JSON or SSE. extproc routed the request and left the plan in the
//! stream's dynamic metadata (`response_plan.rs`); a response without a plan (extproc's own answers,
//! Envoy's local replies) passes untouched.
//!
//! The client's headers wait, as on the ext_proc path, until the first content (streams) or the outcome
//! (non-streamed), so an engine error before any content still gets its own status.
//!
//! With `stream_flush_ms`, a stream's bytes after its first content are held (in Envoy's buffer of this
//! filter) up to that long and go out together: each write to the client is a pass through Envoy's codec
//! and filter chain and a socket write, which costs about what the rest of the path costs per token. The
//! first content always goes at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use extproc_core::contracts::{OUTCOME_TRAILER, RESPONSE_PLAN_KEY, RESPONSE_PLAN_NAMESPACE};
use extproc_core::error::ApiError;
use extproc_core::stream::engine_outcome::{self, Ending};
use extproc_core::stream::response::ResponseTranslator;
use extproc_core::stream::response_plan::{ResponseOutcome, ResponsePlan};
use extproc_core::stream::Missed;

use crate::abi::status;
use crate::filter::HttpFilter;
use crate::host::Stream;
use crate::models::ResponseConfig;
use crate::watchdog::{self, Watch, DEADLINE_EVENT, FLUSH_EVENT, SHUTDOWN_EVENT};

const REQUEST_ID_HEADER: &str = "x-request-id";

/// The most bytes held for a flush: past it they go at once (Envoy's buffer limit is far above).
const MAX_HELD_BYTES: usize = 64 * 1024;

enum State {
    /// Not a routed engine call (no plan): nothing to do.
    Passing,
    /// Translating; `headers_sent`: the client's headers went on.
    Translating {
        translator: Box<ResponseTranslator>,
        request_id: String,
        headers_sent: bool,
    },
    /// The client has its whole answer; whatever the engine still sends is dropped.
    Done,
}

pub struct ResponseFilter {
    config: Arc<ResponseConfig>,
    state: State,
    /// What the answer came to, once it ended: extproc reads it from the trailers (`OUTCOME_TRAILER`).
    outcome: Option<ResponseOutcome>,
    /// Envoy sent a local reply (extproc's immediate response, e.g. its first-token timeout, or this
    /// filter's error): its headers come through this filter too and pass untouched.
    local_reply: bool,
    /// The plan's inter-token deadline (zero: none), watched from the engine's first message on.
    inter_token: Duration,
    watch: Option<Watch>,
    /// Since when stream bytes are held for a flush (in Envoy's buffer), and how many.
    held_since: Option<Instant>,
    held_bytes: usize,
}

impl ResponseFilter {
    pub fn new(config: Arc<ResponseConfig>) -> ResponseFilter {
        ResponseFilter {
            config,
            state: State::Passing,
            outcome: None,
            local_reply: false,
            inter_token: Duration::ZERO,
            watch: None,
            held_since: None,
            held_bytes: 0,
        }
    }

    /// The translator of this stream's plan; an error when the plan cannot be followed.
    fn start(&mut self, plan: &[u8]) -> Result<(ResponseTranslator, String), ApiError> {
        let plan = ResponsePlan::from_json(plan).map_err(ApiError::internal)?;
        let model = self
            .config
            .models
            .get(&plan.model)
            .ok_or_else(|| ApiError::internal(format!("the Envoy module does not serve model '{}'", plan.model)))?;
        let shape = plan.shape(|| model.dropped_special_ids()).map_err(ApiError::internal)?;
        let translator = ResponseTranslator::new(model.files.clone(), shape, plan.max_message);
        self.inter_token = Duration::from_millis(plan.inter_token_ms);
        Ok((translator, plan.request_id))
    }
}

/// The client's headers: status, content type, no gRPC or length headers (the body changes size).
fn set_client_headers(stream: &Stream, status: u16, content_type: &str, request_id: &str) {
    stream.set_response_header(":status", &status.to_string());
    stream.set_response_header("content-type", content_type);
    if content_type == "text/event-stream" {
        stream.set_response_header("cache-control", "no-cache");
    }
    if !request_id.is_empty() {
        stream.set_response_header(REQUEST_ID_HEADER, request_id);
    }
    for name in ["grpc-accept-encoding", "grpc-encoding", "content-length"] {
        stream.remove_response_header(name);
    }
}

/// An error before the response began: Envoy's local reply, as extproc's immediate response makes it.
fn send_error(stream: &Stream, error: &ApiError, request_id: &str) {
    let retry_after = error.retry_after_s.map(|s| s.to_string());
    let mut headers = vec![("content-type", "application/json")];
    if !request_id.is_empty() {
        headers.push((REQUEST_ID_HEADER, request_id));
    }
    if let Some(seconds) = &retry_after {
        headers.push(("retry-after", seconds));
    }
    stream.send_response(error.status as u32, &headers, &error.to_json(), "extproc_error");
}

/// The error of answers the gateway's shutdown ends: the ext_proc path's words (`StreamMachine::shutdown`).
fn shutting_down() -> ApiError {
    ApiError::unavailable("the gateway is shutting down")
}

fn header_str(value: &Option<Vec<u8>>) -> Option<&str> {
    value.as_deref().and_then(|v| std::str::from_utf8(v).ok())
}

impl ResponseFilter {
    /// The end of the exchange: headers if still owed, then the last bytes; `self.outcome` keeps what the
    /// answer came to.
    fn end(&mut self, stream: &Stream, error: Option<ApiError>) -> Vec<u8> {
        let State::Translating {
            translator,
            request_id,
            headers_sent,
        } = &mut self.state
        else {
            return Vec::new();
        };
        let Ending { headers, body, status } = engine_outcome::ending(translator, error.as_ref(), *headers_sent);
        self.outcome = Some(ResponseOutcome {
            status,
            prompt_tokens: translator.usage.prompt_tokens,
            completion_tokens: translator.usage.completion_tokens,
            cached_tokens: translator.usage.cached_tokens,
            finish_reason: translator.finish_reason().unwrap_or_default(),
            error: error.as_ref().map(|e| e.message.clone()).unwrap_or_default(),
            timed_out: false,
            cut: false,
        });
        if let Some((status, content_type)) = headers {
            set_client_headers(stream, status, content_type, request_id);
        }
        if let (Some(seconds), false) = (error.as_ref().and_then(|e| e.retry_after_s), *headers_sent) {
            stream.set_response_header("retry-after", &seconds.to_string());
        }
        self.state = State::Done;
        self.watch = None;
        // Whatever is held goes out before `body`: it is in Envoy's buffer, ahead of it.
        self.held_since = None;
        body
    }

    /// The engine sent a message: its inter-token deadline starts again (and starts at the first).
    fn engine_progress(&self) {
        if let Some(watch) = &self.watch {
            watch.progress();
        }
    }

    /// A stream's `events` after its first content become the body event's bytes; the status says
    /// whether they go now (with whatever is held before them) or are held. Held bytes go with the
    /// first message that finds them `stream_flush` old, or on the flush timer (`flush`).
    fn send_or_hold(&mut self, stream: &Stream, events: &[u8]) -> u32 {
        stream.replace_received_body(events);
        let window = self.config.stream_flush;
        if window.is_zero() || (self.held_since.is_none() && events.is_empty()) {
            return if events.is_empty() {
                status::BODY_STOP_ITERATION_NO_BUFFER
            } else {
                status::CONTINUE
            };
        }
        let since = *self.held_since.get_or_insert_with(Instant::now);
        self.held_bytes += events.len();
        let waited = since.elapsed();
        if waited >= window || self.held_bytes >= MAX_HELD_BYTES {
            self.held_since = None;
            self.held_bytes = 0;
            if let Some(watch) = &self.watch {
                watch.disarm_flush();
            }
            return status::CONTINUE;
        }
        if let Some(watch) = &self.watch {
            watch.arm_flush(window - waited);
        }
        status::BODY_STOP_ITERATION_AND_BUFFER
    }

    /// The flush timer fell due: the held bytes go on to the client.
    fn flush(&mut self, stream: &Stream) {
        if self.held_since.is_none() || !matches!(self.state, State::Translating { .. }) {
            return;
        }
        self.held_since = None;
        self.held_bytes = 0;
        stream.continue_response();
    }

    /// The engine missed its inter-token deadline: the client hears it as on the ext_proc path (a 504
    /// before the answer began, else an SSE error event and `data: [DONE]`), and the outcome tells
    /// extproc, which penalises the endpoint and aborts the call. Ending the stream also makes Envoy
    /// reset the engine call.
    fn time_out(&mut self, stream: &Stream, budget: Duration) {
        let error = ApiError::new(504, "timeout", Missed::NextToken(budget).message());
        self.cut(stream, error, true);
    }

    /// End the answer now with `error`, as the ext_proc path's server does (`time_out`, shutdown):
    /// `timed_out` tells extproc to penalise the endpoint.
    fn cut(&mut self, stream: &Stream, error: ApiError, timed_out: bool) {
        let State::Translating {
            request_id,
            headers_sent,
            ..
        } = &self.state
        else {
            self.watch = None;
            return;
        };
        if !*headers_sent {
            let request_id = request_id.clone();
            self.watch = None;
            self.state = State::Done;
            send_error(stream, &error, &request_id);
            return;
        }
        // The held bytes leave Envoy's buffer to go first: what is sent from here bypasses this filter.
        let mut body = stream.take_buffered_body();
        body.extend(self.end(stream, Some(error)));
        let outcome = self.outcome.as_mut().map(|o| {
            o.timed_out = timed_out;
            o.cut = true;
            serde_json::to_string(o).unwrap_or_default()
        });
        // What this filter sends now passes through it too.
        self.state = State::Passing;
        stream.send_data(&body, false);
        stream.send_trailers(&[(OUTCOME_TRAILER, outcome.as_deref().unwrap_or("{}"))]);
    }
}

impl HttpFilter for ResponseFilter {
    fn response_headers(&mut self, stream: &Stream, end_of_stream: bool) -> u32 {
        if self.local_reply {
            return status::CONTINUE;
        }
        let Some(plan) = stream.metadata_string(RESPONSE_PLAN_NAMESPACE, RESPONSE_PLAN_KEY) else {
            return status::CONTINUE;
        };
        let request_id = stream
            .request_header(REQUEST_ID_HEADER)
            .and_then(|v| String::from_utf8(v).ok())
            .unwrap_or_default();
        let (translator, plan_request_id) = match self.start(&plan) {
            Ok(started) => started,
            Err(error) => {
                self.state = State::Done;
                send_error(stream, &error, &request_id);
                return status::HEADERS_STOP_ITERATION;
            }
        };
        let status_value = stream.response_header(":status");
        let grpc_status = stream.response_header("grpc-status");
        let grpc_message = stream.response_header("grpc-message");
        let ended = engine_outcome::headers_error(
            header_str(&status_value).unwrap_or_default(),
            header_str(&grpc_status),
            header_str(&grpc_message),
            end_of_stream,
        );
        if let Some((error, _outcome)) = ended {
            self.state = State::Done;
            send_error(stream, &error, &plan_request_id);
            return status::HEADERS_STOP_ITERATION;
        }
        if watchdog::stopping() {
            // The gateway stopped after this call was routed: as extproc answers then.
            self.state = State::Done;
            send_error(stream, &shutting_down(), &plan_request_id);
            return status::HEADERS_STOP_ITERATION;
        }
        self.state = State::Translating {
            translator: Box::new(translator),
            request_id: plan_request_id,
            headers_sent: false,
        };
        // Every answer is watched: its deadline, flushes and the gateway's shutdown.
        let deadline = (!self.inter_token.is_zero()).then_some(self.inter_token);
        self.watch = Some(Watch::start(stream.new_scheduler(), deadline));
        // Held until the first content or the outcome.
        status::HEADERS_STOP_ITERATION
    }

    fn response_body(&mut self, stream: &Stream, end_of_stream: bool) -> u32 {
        let pushed = match &mut self.state {
            State::Passing => return status::CONTINUE,
            State::Done => {
                stream.replace_received_body(&[]);
                return if end_of_stream {
                    status::CONTINUE
                } else {
                    status::BODY_STOP_ITERATION_NO_BUFFER
                };
            }
            State::Translating { translator, .. } => {
                let body = stream.received_body();
                let pushed = translator.push(&body);
                if !body.is_empty() {
                    self.engine_progress();
                }
                pushed
            }
        };
        let events = match pushed {
            Ok(events) => events,
            Err(error) => {
                let body = self.end(stream, Some(error));
                stream.replace_received_body(&body);
                return status::CONTINUE;
            }
        };
        if end_of_stream {
            // The engine closed the body without trailers: the end, and the call's outcome is unknown.
            let error = match &self.state {
                State::Translating { translator, .. } => engine_outcome::unfinished_error(translator),
                _ => None,
            };
            let mut body = events;
            body.extend(self.end(stream, error));
            stream.replace_received_body(&body);
            return status::CONTINUE;
        }
        if let State::Translating {
            request_id,
            headers_sent,
            ..
        } = &mut self.state
        {
            if !*headers_sent && !events.is_empty() {
                // The first content goes at once, headers with it.
                *headers_sent = true;
                set_client_headers(stream, 200, "text/event-stream", request_id);
                stream.replace_received_body(&events);
                return status::CONTINUE;
            }
        }
        self.send_or_hold(stream, &events)
    }

    /// A local reply (Envoy's own after the engine failed to answer, or the error this filter sent) goes
    /// through untouched: Envoy's local-reply mappers give it its OpenAI shape.
    fn local_reply(&mut self) {
        self.state = State::Passing;
        self.local_reply = true;
        self.watch = None;
    }

    fn scheduled(&mut self, stream: &Stream, event_id: u64) {
        if event_id == FLUSH_EVENT {
            self.flush(stream);
            return;
        }
        if event_id == SHUTDOWN_EVENT {
            self.cut(stream, shutting_down(), false);
            return;
        }
        let Some(watch) = self.watch.as_ref().filter(|_| event_id == DEADLINE_EVENT) else {
            return;
        };
        if watch.missed() {
            let budget = watch.budget();
            self.time_out(stream, budget);
        }
    }

    fn response_trailers(&mut self, stream: &Stream) -> u32 {
        if matches!(self.state, State::Passing) {
            return status::CONTINUE;
        }
        if let State::Translating { translator, .. } = &self.state {
            let code = stream.response_trailer("grpc-status");
            let message = stream.response_trailer("grpc-message");
            let (error, _outcome) = engine_outcome::trailers_error(header_str(&code), header_str(&message), translator);
            let body = self.end(stream, error);
            stream.add_body(&body);
        }
        for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
            stream.remove_response_trailer(name);
        }
        if let Some(json) = self.outcome.as_ref().and_then(|o| serde_json::to_string(o).ok()) {
            stream.set_response_trailer(OUTCOME_TRAILER, &json);
        }
        status::CONTINUE
    }
}
