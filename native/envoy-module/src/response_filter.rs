//! The response filter: the engine's gRPC response to the client's OpenAI answer, inside Envoy, with the
//! core's own response side (`extproc_core::stream::response`, `engine_outcome`): frames → engine outputs
//! → detokenized text → stop strings → JSON or SSE. extproc routed the request and left the plan in the
//! stream's dynamic metadata (`response_plan.rs`); a response without a plan (extproc's own answers,
//! Envoy's local replies) passes untouched.
//!
//! The client's headers wait, as on the ext_proc path, until the first content (streams) or the outcome
//! (non-streamed), so an engine error before any content still gets its own status.

use std::sync::Arc;
use std::time::Duration;

use extproc_core::contracts::{OUTCOME_TRAILER, RESPONSE_PLAN_KEY, RESPONSE_PLAN_NAMESPACE};
use extproc_core::error::ApiError;
use extproc_core::stream::engine_outcome::{self, Ending};
use extproc_core::stream::response::ResponseTranslator;
use extproc_core::stream::response_plan::{ResponseOutcome, ResponsePlan};
use extproc_core::stream::Missed;

use crate::abi::status;
use crate::filter::HttpFilter;
use crate::host::Stream;
use crate::models::Models;
use crate::watchdog::{Watch, DEADLINE_EVENT};

const REQUEST_ID_HEADER: &str = "x-request-id";

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
    models: Arc<Models>,
    state: State,
    /// What the answer came to, once it ended: extproc reads it from the trailers (`OUTCOME_TRAILER`).
    outcome: Option<ResponseOutcome>,
    /// Envoy sent a local reply (extproc's immediate response, e.g. its first-token timeout, or this
    /// filter's error): its headers come through this filter too and pass untouched.
    local_reply: bool,
    /// The plan's inter-token deadline (zero: none), watched from the engine's first message on.
    inter_token: Duration,
    watch: Option<Watch>,
}

impl ResponseFilter {
    pub fn new(models: Arc<Models>) -> ResponseFilter {
        ResponseFilter {
            models,
            state: State::Passing,
            outcome: None,
            local_reply: false,
            inter_token: Duration::ZERO,
            watch: None,
        }
    }

    /// The translator of this stream's plan; an error when the plan cannot be followed.
    fn start(&mut self, plan: &[u8]) -> Result<(ResponseTranslator, String), ApiError> {
        let plan = ResponsePlan::from_json(plan).map_err(ApiError::internal)?;
        let model = self
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
        });
        if let Some((status, content_type)) = headers {
            set_client_headers(stream, status, content_type, request_id);
        }
        if let (Some(seconds), false) = (error.as_ref().and_then(|e| e.retry_after_s), *headers_sent) {
            stream.set_response_header("retry-after", &seconds.to_string());
        }
        self.state = State::Done;
        self.watch = None;
        body
    }

    /// The engine sent a message: its inter-token deadline starts again (and starts at the first).
    fn engine_progress(&mut self, stream: &Stream) {
        match &self.watch {
            Some(watch) => watch.progress(),
            None if !self.inter_token.is_zero() => {
                self.watch = Some(Watch::start(stream.new_scheduler(), self.inter_token))
            }
            None => {}
        }
    }

    /// The engine missed its inter-token deadline: the client hears it as on the ext_proc path (a 504
    /// before the answer began, else an SSE error event and `data: [DONE]`), and the outcome tells
    /// extproc, which penalises the endpoint and aborts the call. Ending the stream also makes Envoy
    /// reset the engine call.
    fn time_out(&mut self, stream: &Stream, budget: Duration) {
        let State::Translating {
            request_id,
            headers_sent,
            ..
        } = &self.state
        else {
            self.watch = None;
            return;
        };
        let error = ApiError::new(504, "timeout", Missed::NextToken(budget).message());
        if !*headers_sent {
            let request_id = request_id.clone();
            self.watch = None;
            self.state = State::Done;
            send_error(stream, &error, &request_id);
            return;
        }
        let body = self.end(stream, Some(error));
        let outcome = self.outcome.as_mut().map(|o| {
            o.timed_out = true;
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
        self.state = State::Translating {
            translator: Box::new(translator),
            request_id: plan_request_id,
            headers_sent: false,
        };
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
                    self.engine_progress(stream);
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
        stream.replace_received_body(&events);
        if events.is_empty() {
            return status::BODY_STOP_ITERATION_NO_BUFFER;
        }
        if let State::Translating {
            request_id,
            headers_sent,
            ..
        } = &mut self.state
        {
            if !*headers_sent {
                *headers_sent = true;
                set_client_headers(stream, 200, "text/event-stream", request_id);
            }
        }
        status::CONTINUE
    }

    /// A local reply (Envoy's own after the engine failed to answer, or the error this filter sent) goes
    /// through untouched: Envoy's local-reply mappers give it its OpenAI shape.
    fn local_reply(&mut self) {
        self.state = State::Passing;
        self.local_reply = true;
        self.watch = None;
    }

    fn scheduled(&mut self, stream: &Stream, event_id: u64) {
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
