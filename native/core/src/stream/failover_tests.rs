//! A request stream and the router's view of its engine: failures the stream sees penalise the engine,
//! and a call that misses its first-token or inter-token deadline ends with a 504 (or an SSE error event
//! once the stream began) and penalises it too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Deadlines, RequestStream};
use crate::engine::Protocol;
use crate::gateway::{Gateway, Limits};
use crate::grpc_frame;
use crate::pb::ext_proc::{
    body_mutation::Mutation, processing_request::Request, processing_response::Response, HeaderMap, HeaderValue,
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use crate::pb::vllm;
use crate::routing::{RouterConfig, Standing};
use crate::test_assets::llama3_model_dir;
use prost::Message;

const A: &str = "10.0.0.1:50051";
const B: &str = "10.0.0.2:50051";
const FIRST: Duration = Duration::from_secs(2);
const NEXT: Duration = Duration::from_secs(1);

fn gateway() -> Arc<Gateway> {
    let gateway = Arc::new(Gateway::new(Limits {
        deadlines: Deadlines {
            first_token: FIRST,
            inter_token: NEXT,
        },
        ..Limits::default()
    }));
    let model = gateway
        .add_model(
            "m",
            &llama3_model_dir("failover"),
            Some(4096),
            "least_load",
            RouterConfig::default(),
        )
        .unwrap();
    model
        .set_endpoints(vec![(A.into(), 0, Protocol::Vllm, 1), (B.into(), 0, Protocol::Vllm, 1)])
        .unwrap();
    gateway
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: k.to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

fn message(request: Request) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..Default::default()
    }
}

/// A routed completion request; returns the stream and the engine it went to.
fn routed(gateway: &Arc<Gateway>, stream: bool) -> (RequestStream, String) {
    let mut s = RequestStream::new(gateway.clone());
    let h = headers(&[(":method", "POST"), (":path", "/v1/completions")]);
    assert!(s
        .process(message(Request::RequestHeaders(HttpHeaders {
            headers: Some(h),
            end_of_stream: false
        })))
        .is_empty());
    let body = format!(r#"{{"model": "m", "prompt": "Hello", "max_tokens": 4, "stream": {stream}}}"#);
    let replies = s.process(message(Request::RequestBody(HttpBody {
        body: body.into_bytes(),
        end_of_stream: true,
    })));
    assert!(
        matches!(replies[0].response, Some(Response::RequestHeaders(_))),
        "{replies:?}"
    );
    let engine = s.summary().endpoint;
    (s, engine)
}

fn engine_headers(s: &mut RequestStream, extra: &[(&str, &str)]) -> Vec<ProcessingResponse> {
    let mut pairs = vec![(":status", "200"), ("content-type", "application/grpc")];
    pairs.extend_from_slice(extra);
    s.process(message(Request::ResponseHeaders(HttpHeaders {
        headers: Some(headers(&pairs)),
        end_of_stream: false,
    })))
}

fn token_chunk(token: u32) -> Vec<u8> {
    let response = vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Chunk(vllm::GenerateStreamChunk {
            token_ids: vec![token],
            prompt_tokens: 2,
            completion_tokens: 1,
            ..Default::default()
        })),
    };
    grpc_frame::encode(&response.encode_to_vec())
}

fn standing(gateway: &Gateway, engine: &str) -> Standing {
    let model = gateway.model("m").unwrap();
    model
        .router
        .endpoints()
        .into_iter()
        .find(|e| &*e.address == engine)
        .unwrap()
        .standing
}

fn immediate_status(replies: &[ProcessingResponse]) -> (i32, serde_json::Value) {
    let Some(Response::ImmediateResponse(r)) = &replies[0].response else {
        panic!("expected an immediate response, got {replies:?}");
    };
    (
        r.status.as_ref().unwrap().code,
        serde_json::from_slice(&r.body).unwrap(),
    )
}

fn body_text(replies: &[ProcessingResponse]) -> (String, bool) {
    let mut text = String::new();
    let mut end = false;
    for r in replies {
        if let Some(Response::ResponseBody(b)) = &r.response {
            let mutation = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
            if let Some(Mutation::StreamedResponse(s)) = &mutation.mutation {
                text.push_str(std::str::from_utf8(&s.body).unwrap());
                end |= s.end_of_stream;
            }
        }
    }
    (text, end)
}

#[test]
fn an_engine_silent_past_the_first_token_deadline_gets_a_504_and_is_penalised() {
    let gateway = gateway();
    let (mut s, engine) = routed(&gateway, true);
    let start = Instant::now();
    let deadline = s.deadline().expect("a call waiting for its first token has a deadline");
    assert!(deadline <= start + FIRST && deadline + FIRST >= start + FIRST);
    assert!(s.time_out(deadline - Duration::from_millis(1)).is_empty(), "not yet");
    assert!(s.pending_abort().is_some());
    let replies = s.time_out(deadline);
    let (status, body) = immediate_status(&replies);
    assert_eq!(status, 504);
    assert_eq!(body["error"]["type"], "timeout");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("first_token_timeout"));
    assert_eq!(s.deadline(), None, "the exchange is over");
    assert_eq!(s.summary().status, 504);
    assert_eq!(standing(&gateway, &engine), Standing::Ejected);
    // The next request goes to the other engine even though the stalled one holds nothing now.
    drop(s);
    let (_, next) = routed(&gateway, true);
    assert_ne!(next, engine);
}

#[test]
fn a_stream_silent_between_tokens_ends_with_an_error_event_and_done() {
    let gateway = gateway();
    let (mut s, engine) = routed(&gateway, true);
    assert!(engine_headers(&mut s, &[]).is_empty());
    let replies = s.process(message(Request::ResponseBody(HttpBody {
        body: token_chunk(9906),
        end_of_stream: false,
    })));
    assert!(!replies.is_empty(), "the first token went out");
    let after_token = s.deadline().unwrap();
    assert!(after_token <= Instant::now() + NEXT);
    let replies = s.time_out(after_token);
    let (text, end) = body_text(&replies);
    assert!(end, "the body ends");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    let error: serde_json::Value = serde_json::from_str(events[events.len() - 2].trim_start_matches("data: ")).unwrap();
    assert_eq!(error["error"]["code"], 504);
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("inter_token_timeout"));
    assert!(
        !replies
            .iter()
            .any(|r| matches!(r.response, Some(Response::ResponseTrailers(_)))),
        "no unprompted trailers reply"
    );
    assert_eq!(standing(&gateway, &engine), Standing::Ejected);
}

#[test]
fn a_non_streamed_call_gets_one_deadline_for_its_whole_answer() {
    let gateway = gateway();
    let (s, _) = routed(&gateway, false);
    let expected = Instant::now() + FIRST + NEXT * 4; // max_tokens 4
    let deadline = s.deadline().unwrap();
    assert!(deadline <= expected && deadline + Duration::from_secs(1) > expected);
}

#[test]
fn engine_statuses_penalise_as_down_busy_or_not_at_all() {
    for (code, expected) in [
        ("14", Standing::Ejected),
        ("8", Standing::Ejected),
        ("13", Standing::Ejected),
        ("3", Standing::Closed), // INVALID_ARGUMENT: the request's fault, the engine is fine
    ] {
        let gateway = gateway();
        let (mut s, engine) = routed(&gateway, false);
        let replies = engine_headers(&mut s, &[("grpc-status", code), ("grpc-message", "x")]);
        assert!(matches!(replies[0].response, Some(Response::ImmediateResponse(_))));
        assert_eq!(standing(&gateway, &engine), expected, "grpc-status {code}");
    }
    // Envoy's own 503 (the connection to the engine failed) penalises it too.
    let gateway = gateway();
    let (mut s, engine) = routed(&gateway, false);
    let replies = s.process(message(Request::ResponseHeaders(HttpHeaders {
        headers: Some(headers(&[(":status", "503"), ("content-type", "text/plain")])),
        end_of_stream: false,
    })));
    assert!(!replies.is_empty());
    assert_eq!(standing(&gateway, &engine), Standing::Ejected);
}

#[test]
fn a_first_token_closes_the_penalty_of_a_probed_engine() {
    let gateway = gateway();
    let model = gateway.model("m").unwrap();
    let (mut s, engine) = routed(&gateway, true);
    model.router.report(&engine, None, Err(crate::routing::Failure::Busy));
    assert_eq!(standing(&gateway, &engine), Standing::Ejected);
    engine_headers(&mut s, &[]);
    s.process(message(Request::ResponseBody(HttpBody {
        body: token_chunk(9906),
        end_of_stream: false,
    })));
    assert_eq!(standing(&gateway, &engine), Standing::Closed, "it answered: alive");
}

/// The plan a module-path stream leaves for the Envoy module, from its request-headers reply.
fn response_plan(replies: &[ProcessingResponse]) -> super::response_plan::ResponsePlan {
    use crate::pb::structs::value::Kind;
    let metadata = replies[0]
        .dynamic_metadata
        .as_ref()
        .expect("the plan travels as dynamic metadata");
    let Some(Kind::StructValue(plan)) = &metadata.fields[crate::contracts::RESPONSE_PLAN_NAMESPACE].kind else {
        panic!("the namespace is a struct");
    };
    let json = plan.fields[crate::contracts::RESPONSE_PLAN_KEY]
        .as_str()
        .expect("the plan is JSON text");
    super::response_plan::ResponsePlan::from_json(json.as_bytes()).unwrap()
}

#[test]
fn with_the_envoy_module_the_stream_carries_the_inter_token_deadline_and_a_timeout_aborts_and_penalises() {
    let gateway = gateway();
    let mut s = RequestStream::new(gateway.clone());
    // The Envoy in front said the module answers (`contracts::RESPONSE_PATH_METADATA`).
    s.answered_in_envoy();
    let h = headers(&[(":method", "POST"), (":path", "/v1/completions")]);
    assert!(s
        .process(message(Request::RequestHeaders(HttpHeaders {
            headers: Some(h),
            end_of_stream: false
        })))
        .is_empty());
    let body = r#"{"model": "m", "prompt": "Hello", "max_tokens": 4, "stream": true}"#;
    let replies = s.process(message(Request::RequestBody(HttpBody {
        body: body.as_bytes().to_vec(),
        end_of_stream: true,
    })));
    let plan = response_plan(&replies);
    assert_eq!(plan.inter_token_ms, NEXT.as_millis() as u64);
    let engine = s.summary().endpoint;
    // The module lets the headers through at the first content; the deadline is the module's from then.
    assert!(engine_headers(&mut s, &[]).len() == 1);
    assert_eq!(s.deadline(), None);
    assert!(s.pending_abort().is_some());
    let outcome = r#"{"status":200,"prompt_tokens":2,"completion_tokens":1,"cached_tokens":0,"finish_reason":"","error":"the engine sent no next token within 1 s (inter_token_timeout)","timed_out":true}"#;
    let replies = s.process(message(Request::ResponseTrailers(crate::pb::ext_proc::HttpTrailers {
        trailers: Some(headers(&[(crate::contracts::OUTCOME_TRAILER, outcome)])),
    })));
    assert_eq!(replies.len(), 1, "the outcome trailer is removed");
    let summary = s.summary();
    assert_eq!((summary.status, summary.completion_tokens), (200, 1));
    assert!(summary.error.contains("inter_token_timeout"));
    let abort = s.pending_abort().expect("the stalled engine call is still to abort");
    assert_eq!(abort.endpoint, engine);
    assert_eq!(standing(&gateway, &engine), Standing::Ejected);
}
