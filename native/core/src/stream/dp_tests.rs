//! Data-parallel ranks through the stream: the destination names engine addresses only, the rank
//! travels in the Generate request (`data_parallel_rank`), fallbacks are other engines.

use std::collections::HashSet;
use std::sync::Arc;

use prost::Message;

use super::replies::{DESTINATION_HEADER, LB_METADATA_NAMESPACE, MAX_RETRIES_HEADER};
use super::test_model::llama3_model_dir;
use super::RequestStream;
use crate::engine::Protocol;
use crate::gateway::{Gateway, Limits};
use crate::pb::ext_proc::{
    body_mutation::Mutation, processing_request::Request, processing_response::Response, HeaderMap, HeaderValue,
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use crate::pb::structs::value::Kind;
use crate::pb::{sglang, vllm};
use crate::routing::RouterConfig;

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
