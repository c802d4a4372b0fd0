//! Builders for the `ProcessingResponse` messages Envoy accepts, in the shapes it requires.

use crate::contracts::{
    DESTINATION_HEADER, ENGINE_REQUEST_HEADERS, LB_METADATA_NAMESPACE, MAX_RETRIES_HEADER, OUTCOME_TRAILER,
    REQUEST_ID_HEADER, RESPONSE_PLAN_KEY as PLAN_KEY, RESPONSE_PLAN_NAMESPACE as PLAN_NAMESPACE,
};
use crate::error::ApiError;
use crate::pb::ext_proc::{
    body_mutation, processing_response::Response, streamed_immediate_response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMap, HeaderMutation, HeaderValue, HeadersResponse, HttpHeaders, HttpStatus,
    ImmediateResponse, ProcessingResponse, StreamedBodyResponse, StreamedImmediateResponse, TrailersResponse,
};
use crate::pb::structs::{Struct, Value};

/// Envoy's ext_proc takes streamed body chunks of at most 64 KiB; stay clearly under it.
pub const MAX_BODY_CHUNK: usize = 62_000;

pub fn immediate(
    status: u16,
    content_type: &str,
    body: Vec<u8>,
    request_id: &str,
    details: &str,
) -> ProcessingResponse {
    let mut headers = HeaderMutation::default();
    headers.set("content-type", content_type);
    if !request_id.is_empty() {
        headers.set(REQUEST_ID_HEADER, request_id);
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus { code: status as i32 }),
            headers: Some(headers),
            body,
            details: details.to_string(),
        })),
        dynamic_metadata: None,
    }
}

pub fn immediate_error(error: &ApiError, request_id: &str) -> ProcessingResponse {
    let mut reply = immediate(
        error.status,
        "application/json",
        error.to_json(),
        request_id,
        "extproc_error",
    );
    if let (Some(seconds), Some(Response::ImmediateResponse(r))) = (error.retry_after_s, reply.response.as_mut()) {
        r.headers
            .get_or_insert_with(HeaderMutation::default)
            .set("retry-after", &seconds.to_string());
    }
    reply
}

fn common(mutation: HeaderMutation, clear_route_cache: bool) -> Option<CommonResponse> {
    Some(CommonResponse {
        status: 0,
        header_mutation: Some(mutation),
        body_mutation: None,
        clear_route_cache,
    })
}

/// The client's request headers that must not reach the engine, each name once: every one but the
/// pseudo-headers, `host` (Envoy routes by them and refuses their removal) and `ENGINE_REQUEST_HEADERS`.
pub fn headers_not_for_engine<'a>(client_headers: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut removed: Vec<String> = Vec::new();
    for name in client_headers {
        let name = name.to_ascii_lowercase();
        let kept = name.starts_with(':') || name == "host" || ENGINE_REQUEST_HEADERS.contains(&name.as_str());
        if !kept && !removed.contains(&name) {
            removed.push(name);
        }
    }
    removed
}

/// The request-headers reply that sends the request to `destination`'s gRPC `path`: `destination` is
/// the primary engine's address, then its fallbacks, comma-separated. `removed`: the client headers
/// the engine must not see (`headers_not_for_engine`).
pub fn route_to_engine(destination: &str, path: &str, removed: &[String]) -> ProcessingResponse {
    // Envoy retries at most once per listed fallback: past the list its override_host policy would
    // pick any engine of the cluster, which may serve another model. (Envoy drops the client's own
    // retry headers before any filter runs.)
    let fallbacks = destination.matches(',').count();
    let mut m = HeaderMutation::default();
    m.set(":path", path)
        .set("content-type", "application/grpc")
        .set("te", "trailers")
        .set(DESTINATION_HEADER, destination)
        .set(MAX_RETRIES_HEADER, &fallbacks.to_string())
        .remove("content-length");
    for name in removed.iter().filter(|n| *n != "content-length") {
        m.remove(name);
    }
    let mut lb = Struct::default();
    lb.fields
        .insert(DESTINATION_HEADER.to_string(), Value::string(destination));
    let mut metadata = Struct::default();
    metadata
        .fields
        .insert(LB_METADATA_NAMESPACE.to_string(), Value::structure(lb));
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: common(m, true),
        })),
        dynamic_metadata: Some(metadata),
    }
}

/// The response-headers reply: the client sees `status` and `content_type`, no gRPC headers.
pub fn client_headers(status: u16, content_type: &str, request_id: &str) -> ProcessingResponse {
    let mut m = HeaderMutation::default();
    m.set(":status", &status.to_string()).set("content-type", content_type);
    if content_type == "text/event-stream" {
        m.set("cache-control", "no-cache");
    }
    if !request_id.is_empty() {
        m.set(REQUEST_ID_HEADER, request_id);
    }
    m.remove("grpc-accept-encoding")
        .remove("grpc-encoding")
        .remove("content-length");
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: common(m, false),
        })),
        dynamic_metadata: None,
    }
}

fn body_reply(body: &[u8], end_of_stream: bool, request_side: bool) -> ProcessingResponse {
    let streamed = StreamedBodyResponse {
        body: body.to_vec(),
        end_of_stream,
    };
    let body_response = BodyResponse {
        response: Some(CommonResponse {
            status: 0,
            header_mutation: None,
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(streamed)),
            }),
            clear_route_cache: false,
        }),
    };
    let response = if request_side {
        Response::RequestBody(body_response)
    } else {
        Response::ResponseBody(body_response)
    };
    ProcessingResponse {
        response: Some(response),
        dynamic_metadata: None,
    }
}

/// A replacement body as streamed chunks of at most `MAX_BODY_CHUNK` bytes; the last one ends the
/// stream when `end_of_stream`. An empty body still yields one (empty) chunk.
pub fn body_chunks(body: &[u8], end_of_stream: bool, request_side: bool) -> Vec<ProcessingResponse> {
    if body.is_empty() {
        return vec![body_reply(body, end_of_stream, request_side)];
    }
    let count = body.len().div_ceil(MAX_BODY_CHUNK);
    body.chunks(MAX_BODY_CHUNK)
        .enumerate()
        .map(|(i, chunk)| body_reply(chunk, end_of_stream && i + 1 == count, request_side))
        .collect()
}

/// The first part of a local response streamed in parts (Envoy >= 1.38's `streamed_immediate_response`):
/// status and headers, sent in reply to the request headers.
pub fn local_stream_headers(status: u16, content_type: &str, request_id: &str) -> ProcessingResponse {
    let header = |key: &str, value: &str| HeaderValue {
        key: key.to_string(),
        value: String::new(),
        raw_value: value.as_bytes().to_vec(),
    };
    let mut headers = vec![
        header(":status", &status.to_string()),
        header("content-type", content_type),
        header("cache-control", "no-cache"),
    ];
    if !request_id.is_empty() {
        headers.push(header(REQUEST_ID_HEADER, request_id));
    }
    let part = streamed_immediate_response::Response::HeadersResponse(HttpHeaders {
        headers: Some(HeaderMap { headers }),
        end_of_stream: false,
    });
    local_stream_part(part)
}

/// The next body chunks of a streamed local response (at most `MAX_BODY_CHUNK` bytes each); the last
/// one ends the response when `end_of_stream`.
pub fn local_stream_body(body: &[u8], end_of_stream: bool) -> Vec<ProcessingResponse> {
    let chunks: Vec<&[u8]> = if body.is_empty() {
        vec![body]
    } else {
        body.chunks(MAX_BODY_CHUNK).collect()
    };
    let count = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            local_stream_part(streamed_immediate_response::Response::BodyResponse(
                StreamedBodyResponse {
                    body: chunk.to_vec(),
                    end_of_stream: end_of_stream && i + 1 == count,
                },
            ))
        })
        .collect()
}

fn local_stream_part(part: streamed_immediate_response::Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::StreamedImmediateResponse(StreamedImmediateResponse {
            response: Some(part),
        })),
        dynamic_metadata: None,
    }
}

/// The response-trailers reply: gRPC status trailers are the engine's business, not the client's.
/// Attach the response plan to the reply that routes the request (`response_plan.rs`): Envoy keeps it as
/// dynamic metadata, where the `extproc_envoy` module reads it.
pub fn add_response_plan(reply: &mut ProcessingResponse, plan_json: &str) {
    let mut plan = Struct::default();
    plan.fields.insert(PLAN_KEY.to_string(), Value::string(plan_json));
    reply
        .dynamic_metadata
        .get_or_insert_with(Struct::default)
        .fields
        .insert(PLAN_NAMESPACE.to_string(), Value::structure(plan));
}

/// Response headers or trailers the Envoy module already made the client's: passed on unchanged.
pub fn pass_response_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse { response: None })),
        dynamic_metadata: None,
    }
}

/// The trailers the Envoy module made the client's, less the outcome it left for extproc.
pub fn remove_outcome_trailer() -> ProcessingResponse {
    let mut m = HeaderMutation::default();
    m.remove(OUTCOME_TRAILER);
    ProcessingResponse {
        response: Some(Response::ResponseTrailers(TrailersResponse {
            header_mutation: Some(m),
        })),
        dynamic_metadata: None,
    }
}

pub fn strip_grpc_trailers() -> ProcessingResponse {
    let mut m = HeaderMutation::default();
    m.remove("grpc-status")
        .remove("grpc-message")
        .remove("grpc-status-details-bin");
    ProcessingResponse {
        response: Some(Response::ResponseTrailers(TrailersResponse {
            header_mutation: Some(m),
        })),
        dynamic_metadata: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_headers_the_engine_needs_survive_the_routing_reply() {
        let client = [
            ":method",
            ":path",
            ":authority",
            "host",
            "content-type",
            "content-length",
            "Authorization",
            "cookie",
            "grpc-timeout",
            "x-custom",
            "x-custom",
            "x-request-id",
            "x-forwarded-proto",
            "traceparent",
            "x-envoy-upstream-rq-timeout-ms",
        ];
        let removed = headers_not_for_engine(client);
        assert_eq!(
            removed,
            [
                "content-length",
                "authorization",
                "cookie",
                "grpc-timeout",
                "x-custom",
                "x-envoy-upstream-rq-timeout-ms"
            ]
        );
        let reply = route_to_engine("10.0.0.1:5", "/p", &removed);
        let Some(Response::RequestHeaders(h)) = reply.response else {
            panic!("not a headers reply")
        };
        let m = h.response.unwrap().header_mutation.unwrap();
        // Removed once each (Envoy refuses more removals than the request has headers).
        let mut names = m.remove_headers.clone();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), m.remove_headers.len());
        for name in ["authorization", "cookie", "grpc-timeout", "x-custom", "content-length"] {
            assert!(m.remove_headers.iter().any(|r| r == name), "{name} kept");
        }
        let set: Vec<&str> = m
            .set_headers
            .iter()
            .map(|h| h.header.as_ref().unwrap().key.as_str())
            .collect();
        assert!(set
            .iter()
            .all(|name| ENGINE_REQUEST_HEADERS.contains(name) || name.starts_with(':')));
    }

    #[test]
    fn bodies_are_split_under_envoys_limit_and_only_the_last_chunk_ends_the_stream() {
        let body = vec![b'x'; MAX_BODY_CHUNK * 2 + 1];
        let chunks = body_chunks(&body, true, true);
        assert_eq!(chunks.len(), 3);
        let ends: Vec<bool> = chunks
            .iter()
            .map(|c| match &c.response {
                Some(Response::RequestBody(b)) => {
                    match &b.response.as_ref().unwrap().body_mutation.as_ref().unwrap().mutation {
                        Some(body_mutation::Mutation::StreamedResponse(s)) => {
                            assert!(s.body.len() <= MAX_BODY_CHUNK);
                            s.end_of_stream
                        }
                        _ => panic!("not streamed"),
                    }
                }
                _ => panic!("not a request body reply"),
            })
            .collect();
        assert_eq!(ends, vec![false, false, true]);
    }
}
