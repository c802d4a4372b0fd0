//! A stream the server cuts at shutdown: the client hears why and its response ends cleanly, and the
//! engine call is still there to abort.

use std::sync::Arc;

use prost::Message;

use super::RequestStream;
use crate::engine::Protocol;
use crate::gateway::{Gateway, Limits};
use crate::grpc_frame;
use crate::pb::ext_proc::{
    body_mutation::Mutation, processing_request::Request, processing_response::Response, HeaderMap, HeaderValue,
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use crate::pb::vllm;
use crate::routing::RouterConfig;
use crate::test_assets::llama3_model_dir;

const ENGINE: &str = "10.0.0.1:50051";

fn gateway() -> Arc<Gateway> {
    let gateway = Arc::new(Gateway::new(Limits {
        max_body_bytes: 1 << 20,
        max_engine_message: 1 << 20,
        destination_fallbacks: 0,
        max_buffered_output_tokens: crate::gateway::DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
        ..Limits::default()
    }));
    let dir = llama3_model_dir("shutdown");
    let model = gateway
        .add_model("m", &dir, Some(4096), "round_robin", RouterConfig::default())
        .unwrap();
    model
        .set_endpoints(vec![(ENGINE.into(), 0, Protocol::Vllm, 1)])
        .unwrap();
    gateway
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    let headers = pairs
        .iter()
        .map(|(k, v)| HeaderValue {
            key: (*k).into(),
            value: String::new(),
            raw_value: v.as_bytes().to_vec(),
        })
        .collect();
    HttpHeaders {
        headers: Some(HeaderMap { headers }),
        end_of_stream,
    }
}

fn send(stream: &mut RequestStream, request: Request) -> Vec<ProcessingResponse> {
    stream.process(ProcessingRequest {
        request: Some(request),
        ..Default::default()
    })
}

/// A completion request routed to the engine, its response headers in: the exchange is under way.
fn exchange(streamed: bool) -> RequestStream {
    let mut stream = RequestStream::new(gateway());
    let request = headers(&[(":method", "POST"), (":path", "/v1/completions")], false);
    assert!(send(&mut stream, Request::RequestHeaders(request)).is_empty());
    let body = format!(r#"{{"model": "m", "prompt": "Hello there", "stream": {streamed}}}"#);
    let routed = send(
        &mut stream,
        Request::RequestBody(HttpBody {
            body: body.into_bytes(),
            end_of_stream: true,
        }),
    );
    assert!(
        matches!(routed[0].response, Some(Response::RequestHeaders(_))),
        "{routed:?}"
    );
    let response = headers(&[(":status", "200"), ("content-type", "application/grpc")], false);
    assert!(send(&mut stream, Request::ResponseHeaders(response)).is_empty());
    stream
}

fn engine_chunk(tokens: &[u32]) -> Vec<u8> {
    let message = vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Chunk(vllm::GenerateStreamChunk {
            token_ids: tokens.to_vec(),
            prompt_tokens: 5,
            completion_tokens: tokens.len() as u32,
            cached_tokens: 0,
            output_logprobs: None,
            index: 0,
        })),
    };
    grpc_frame::encode(&message.encode_to_vec())
}

#[test]
fn a_cut_stream_ends_with_an_error_event_and_done() {
    let mut stream = exchange(true);
    let flowing = send(
        &mut stream,
        Request::ResponseBody(HttpBody {
            body: engine_chunk(&[9906, 1070]),
            end_of_stream: false,
        }),
    );
    assert!(
        matches!(flowing[0].response, Some(Response::ResponseHeaders(_))),
        "the client has its 200"
    );
    assert_eq!(
        stream.pending_abort().expect("the engine call is under way").endpoint,
        ENGINE
    );

    let replies = stream.shutdown();
    let [reply] = replies.as_slice() else {
        panic!("one ending body reply, got {replies:?}")
    };
    let Some(Response::ResponseBody(body)) = &reply.response else {
        panic!("a body reply, got {reply:?}")
    };
    let mutation = body.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
    let Some(Mutation::StreamedResponse(streamed)) = &mutation.mutation else {
        panic!("a streamed body")
    };
    assert!(streamed.end_of_stream, "the client's response ends here");
    let text = String::from_utf8(streamed.body.clone()).unwrap();
    assert!(text.starts_with("data: {\"error\":"), "{text}");
    assert!(
        text.contains("\"code\":503") && text.contains("shutting down"),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(stream.is_done());
    assert_eq!(stream.summary().error, "the gateway is shutting down");
}

#[test]
fn a_cut_request_whose_answer_was_not_started_gets_a_503() {
    let mut stream = exchange(false);
    assert!(stream.pending_abort().is_some());
    let replies = stream.shutdown();
    let [reply] = replies.as_slice() else {
        panic!("one reply, got {replies:?}")
    };
    let Some(Response::ImmediateResponse(immediate)) = &reply.response else {
        panic!("an immediate response, got {reply:?}")
    };
    assert_eq!(immediate.status.as_ref().unwrap().code, 503);
    assert!(String::from_utf8_lossy(&immediate.body).contains("shutting down"));
}

#[test]
fn a_stream_not_yet_routed_has_nothing_to_say_at_shutdown() {
    let mut stream = RequestStream::new(gateway());
    let request = headers(&[(":method", "POST"), (":path", "/v1/completions")], false);
    assert!(send(&mut stream, Request::RequestHeaders(request)).is_empty());
    assert!(stream.shutdown().is_empty());
    assert!(stream.pending_abort().is_none());
}
