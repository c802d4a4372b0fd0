//! What a request stream shows operators: `GET /health` from the router's view of the engines, and with
//! tracing on, the engine call's `traceparent` and the phase times in the summary.

use std::sync::Arc;

use super::{trace, RequestStream};
use crate::engine::Protocol;
use crate::gateway::{Gateway, Limits};
use crate::pb::ext_proc::{
    processing_request::Request, processing_response::Response, HeaderMap, HeaderValue, HttpBody, HttpHeaders,
    ProcessingRequest, ProcessingResponse,
};
use crate::routing::RouterConfig;
use crate::test_assets::llama3_model_dir;

const A: &str = "10.0.0.1:50051";
const B: &str = "10.0.0.2:50051";
const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn gateway() -> Arc<Gateway> {
    let gateway = Arc::new(Gateway::new(Limits::default()));
    let model = gateway
        .add_model(
            "m",
            &llama3_model_dir("observability"),
            Some(4096),
            "round_robin",
            RouterConfig::default(),
        )
        .unwrap();
    model
        .set_endpoints(vec![(A.into(), 0, Protocol::Vllm, 1), (B.into(), 0, Protocol::Vllm, 2)])
        .unwrap();
    gateway
}

fn headers(method: &str, path: &str, extra: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
    let mut pairs = vec![(":method", method), (":path", path), ("x-request-id", "r-1")];
    pairs.extend_from_slice(extra);
    let headers = HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: k.to_string(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    };
    ProcessingRequest {
        request: Some(Request::RequestHeaders(HttpHeaders {
            headers: Some(headers),
            end_of_stream,
        })),
        ..Default::default()
    }
}

fn health(gateway: &Arc<Gateway>) -> (i32, serde_json::Value) {
    let mut stream = RequestStream::new(gateway.clone());
    let replies = stream.process(headers("GET", "/health", &[], true));
    let [ProcessingResponse {
        response: Some(Response::ImmediateResponse(answer)),
        ..
    }] = replies.as_slice()
    else {
        panic!("expected one immediate response: {replies:?}");
    };
    assert!(stream.is_done());
    (
        answer.status.as_ref().unwrap().code,
        serde_json::from_slice(&answer.body).unwrap(),
    )
}

#[test]
fn health_is_ok_while_every_model_has_a_ready_engine_and_503_with_the_reason_otherwise() {
    let gateway = gateway();
    let (status, body) = health(&gateway);
    assert_eq!(status, 200);
    // B has two data-parallel ranks: one engine.
    assert_eq!(
        body,
        serde_json::json!({"status": "ok", "models": {"m": {"ready_engines": 2, "engines": 2}}})
    );
    let model = gateway.model("m").unwrap();
    model.router.set_health(A, false);
    assert_eq!(health(&gateway).1["models"]["m"]["ready_engines"], 1);
    model.router.set_health(B, false);
    let (status, body) = health(&gateway);
    assert_eq!(status, 503);
    assert_eq!(body["status"], "unavailable");
    assert_eq!(body["reason"], "model 'm' has no ready engine");
}

/// A completion request's routing reply, and the stream that made it.
fn routed(gateway: &Arc<Gateway>, extra: &[(&str, &str)]) -> (RequestStream, ProcessingResponse) {
    let mut stream = RequestStream::new(gateway.clone());
    assert!(stream
        .process(headers("POST", "/v1/completions", extra, false))
        .is_empty());
    let body = br#"{"model": "m", "prompt": "hi", "max_tokens": 2}"#;
    let mut replies = stream.process(ProcessingRequest {
        request: Some(Request::RequestBody(HttpBody {
            body: body.to_vec(),
            end_of_stream: true,
        })),
        ..Default::default()
    });
    (stream, replies.remove(0))
}

fn traceparent_set(reply: &ProcessingResponse) -> Option<String> {
    let Some(Response::RequestHeaders(h)) = &reply.response else {
        panic!("not the routing reply: {reply:?}")
    };
    let mutation = h.response.as_ref()?.header_mutation.as_ref()?;
    mutation
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == trace::TRACEPARENT_HEADER)
        .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
}

#[test]
fn with_tracing_on_the_engine_call_carries_the_clients_trace_under_the_engine_call_span() {
    let gateway = gateway();
    gateway.set_tracing(true);
    let (stream, reply) = routed(&gateway, &[("traceparent", CLIENT)]);
    let summary = stream.summary();
    let t = summary.trace.expect("a trace context");
    assert_eq!(t.parent_span_id, Some(0x00f067aa0ba902b7));
    assert_eq!(traceparent_set(&reply), Some(t.engine_traceparent()));
    assert!(t
        .engine_traceparent()
        .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
    let phases: Vec<&str> = summary.timings.reached().iter().map(|(p, _)| *p).collect();
    assert_eq!(
        phases,
        ["received", "body", "parsed", "tokenized", "routed", "finished"]
    );
    let times: Vec<u64> = summary.timings.reached().iter().map(|(_, t)| *t).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
}

#[test]
fn with_tracing_off_no_trace_is_made_and_the_clients_traceparent_is_left_alone() {
    let gateway = gateway();
    let (stream, reply) = routed(&gateway, &[("traceparent", CLIENT)]);
    assert!(stream.summary().trace.is_none());
    assert_eq!(traceparent_set(&reply), None);
    assert_ne!(
        stream.summary().timings.routed_ns,
        0,
        "timings are kept for the request log"
    );
}
