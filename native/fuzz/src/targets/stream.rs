//! The whole ext_proc state machine (`RequestStream`) fed arbitrary message sequences: request headers,
//! body chunks and trailers, then the engine's response headers, gRPC body chunks and trailers, and a
//! batch's engine outcomes, in any order and any split. Records (see `records`): the kind's low 3 bits
//! say which message (below), bit 7 is `end_of_stream`; header payloads are `key: value` lines, where
//! `@subset` sets the subset hint and `@upstream` the address Envoy reports it sent to. The header byte's
//! bit 0 is unused by the stream and lets generated inputs say which model (protocol) they target.
//!
//! The gateway serves model `m` on a vLLM engine and `s` on an SGLang engine, both with a tiny byte-level
//! tokenizer and a test chat template. Invariant besides "no panic": once the stream is done, it answers
//! nothing more.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use extproc_core::contracts::{
    OBJECTIVE_HEADER, REQUEST_ID_HEADER, SESSION_HEADER, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE,
    UPSTREAM_ADDRESS_ATTRIBUTE,
};
use extproc_core::engine::Protocol;
use extproc_core::error::ApiError;
use extproc_core::gateway::{Gateway, Limits};
use extproc_core::grpc_frame::{self, FrameDecoder};
use extproc_core::pb::ext_proc::{
    processing_request::Request, HeaderMap, HeaderValue, HttpBody, HttpHeaders, HttpTrailers, Metadata,
    ProcessingRequest,
};
use extproc_core::pb::structs::{Struct, Value as PbValue};
use extproc_core::routing::RouterConfig;
use extproc_core::stream::{CallOutcome, RequestStream};
use serde_json::{json, Value};

use super::{engine_output, records, signature, Target};
use crate::json_gen;
use crate::rng::Rng;

pub const TARGET: Target = Target {
    name: "stream",
    run,
    generate,
    mutate,
    dictionary,
};

const REQUEST_HEADERS: u8 = 0;
const REQUEST_BODY: u8 = 1;
const REQUEST_TRAILERS: u8 = 2;
const RESPONSE_HEADERS: u8 = 3;
const RESPONSE_BODY: u8 = 4;
const RESPONSE_TRAILERS: u8 = 5;
/// The outcomes of a batch's engine calls: each call gets the frames in the payload, or an error
/// when it is empty.
const FANOUT: u8 = 6;
const EOS: u8 = 0x80;

const VLLM_ENGINE: &str = "10.0.0.1:50051";
const SGLANG_ENGINE: &str = "10.0.0.2:50051";
const PATHS: [&str; 10] = [
    "/v1/chat/completions",
    "/v1/chat/completions",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/completions",
    "/v1/completions",
    "/v1/tokenize",
    "/v1/detokenize",
    "/v1/models",
    "/v1/embeddings",
];

/// GPT-2's byte-to-character map: every byte is one token of the tiny vocabulary.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        char::from(b)
    } else {
        let shifted = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + shifted).expect("a valid char")
    }
}

/// A byte-level BPE tokenizer with no merges (256 tokens) and two special tokens.
fn tiny_tokenizer() -> Value {
    let vocab: serde_json::Map<String, Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), Value::from(b)))
        .collect();
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(256, "<s>"), special(257, "</s>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    })
}

fn write_model_dir(dir: &Path) {
    std::fs::create_dir_all(dir).expect("a temp dir");
    let config = json!({
        "chat_template": include_str!("../../../../tests/templates/turns.jinja"),
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 512,
    });
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer().to_string()).expect("write tokenizer.json");
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).expect("write tokenizer_config.json");
}

/// One gateway for the whole run: model files are read once (the directory is removed after).
fn gateway() -> &'static Arc<Gateway> {
    static GATEWAY: OnceLock<Arc<Gateway>> = OnceLock::new();
    GATEWAY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("extproc-fuzz-model-{}", std::process::id()));
        write_model_dir(&dir);
        let gateway = Arc::new(Gateway::new(Limits {
            max_body_bytes: 16 * 1024,
            max_engine_message: 4 * 1024,
            destination_fallbacks: 2,
            ..Limits::default()
        }));
        for (name, address, protocol) in [
            ("m", VLLM_ENGINE, Protocol::Vllm),
            ("s", SGLANG_ENGINE, Protocol::Sglang),
        ] {
            let model = gateway
                .add_model(name, &dir, Some(4096), "round_robin", RouterConfig::default())
                .unwrap_or_else(|e| panic!("the fuzz model: {e}"));
            model
                .set_endpoints(vec![(address.to_string(), 0, protocol, 1)])
                .expect("endpoints");
        }
        let _ = std::fs::remove_dir_all(&dir);
        gateway
    })
}

/// `key: value` lines; `@`-keys are the metadata and attributes they name.
struct Headers {
    map: HeaderMap,
    subset: Option<String>,
    upstream: Option<String>,
}

fn headers(payload: &[u8]) -> Headers {
    let text = String::from_utf8_lossy(payload);
    let mut parsed = Headers {
        map: HeaderMap::default(),
        subset: None,
        upstream: None,
    };
    for line in text.lines() {
        let (key, value) = line.split_once(": ").unwrap_or((line, ""));
        match key {
            "@subset" => parsed.subset = Some(value.to_string()),
            "@upstream" => parsed.upstream = Some(value.to_string()),
            _ => parsed.map.headers.push(HeaderValue {
                key: key.to_string(),
                value: String::new(),
                raw_value: value.as_bytes().to_vec(),
            }),
        }
    }
    parsed
}

fn one_field_struct(key: &str, value: PbValue) -> Struct {
    Struct {
        fields: [(key.to_string(), value)].into_iter().collect(),
    }
}

fn message(kind: u8, payload: &[u8]) -> ProcessingRequest {
    let end_of_stream = kind & EOS != 0;
    let body = || HttpBody {
        body: payload.to_vec(),
        end_of_stream,
    };
    let mut request = ProcessingRequest::default();
    request.request = Some(match kind & 7 {
        REQUEST_HEADERS | RESPONSE_HEADERS => {
            let h = headers(payload);
            if let Some(subset) = h.subset {
                let hint = PbValue::list(subset.split(',').map(PbValue::string).collect());
                request.metadata_context = Some(Metadata {
                    filter_metadata: [(
                        SUBSET_HINT_NAMESPACE.to_string(),
                        one_field_struct(SUBSET_HINT_KEY, hint),
                    )]
                    .into_iter()
                    .collect(),
                });
            }
            if let Some(upstream) = h.upstream {
                let attribute = one_field_struct(UPSTREAM_ADDRESS_ATTRIBUTE, PbValue::string(upstream));
                request.attributes = BTreeMap::from([("envoy.filters.http.ext_proc".to_string(), attribute)]);
            }
            let http = HttpHeaders {
                headers: Some(h.map),
                end_of_stream,
            };
            if kind & 7 == REQUEST_HEADERS {
                Request::RequestHeaders(http)
            } else {
                Request::ResponseHeaders(http)
            }
        }
        REQUEST_BODY => Request::RequestBody(body()),
        RESPONSE_BODY => Request::ResponseBody(body()),
        REQUEST_TRAILERS => Request::RequestTrailers(HttpTrailers {
            trailers: Some(headers(payload).map),
        }),
        _ => Request::ResponseTrailers(HttpTrailers {
            trailers: Some(headers(payload).map),
        }),
    });
    request
}

fn fanout_outcomes(calls: usize, payload: &[u8]) -> Vec<CallOutcome> {
    let frames = FrameDecoder::new(1 << 20).push(payload).unwrap_or_default();
    (0..calls)
        .map(|i| {
            if frames.is_empty() || payload.get(i).is_some_and(|b| b & 0xf == 0xf) {
                Err(ApiError::unavailable("engine unreachable"))
            } else {
                Ok(frames.iter().map(|f| Bytes::copy_from_slice(f)).collect())
            }
        })
        .collect()
}

fn run(data: &[u8]) -> u64 {
    let (_, records) = records::read(data);
    let mut stream = RequestStream::new(gateway().clone());
    // Which messages were answered, and how the request ended.
    let mut answered = std::collections::BTreeSet::new();
    for record in records {
        let done_before = stream.is_done();
        let replies = if record.kind & 7 == FANOUT {
            match stream.take_fanout() {
                Some(calls) => stream.fanout_done(fanout_outcomes(calls.len(), record.payload)),
                None => Vec::new(),
            }
        } else if record.kind & 7 == 7 {
            // An empty message (no request set), as a broken peer might send.
            stream.process(ProcessingRequest::default())
        } else {
            stream.process(message(record.kind, record.payload))
        };
        if done_before {
            assert!(replies.is_empty(), "a finished stream answered: {replies:?}");
        }
        let _ = stream.pending_abort().map(|a| a.request_id.len());
        if !replies.is_empty() {
            answered.insert(record.kind & 7);
        }
    }
    let summary = stream.summary();
    signature(&format!(
        "{answered:?}:{}:{}:{}",
        summary.status,
        // The error's first words: later ones quote the input (a path, a model name).
        summary.error.split(' ').take(2).collect::<Vec<_>>().join(" "),
        stream.is_done()
    ))
}

fn lines(pairs: &[(&str, String)]) -> Vec<u8> {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}: {v}\n"))
        .collect::<String>()
        .into_bytes()
}

/// `payload` in 1..=3 body records, the last with `end_of_stream` unless `open`.
fn chunks(rng: &mut Rng, kind: u8, payload: &[u8], open: bool, out: &mut Vec<(u8, Vec<u8>)>) {
    let parts = 1 + rng.below(3);
    let step = payload.len() / parts + 1;
    let pieces: Vec<&[u8]> = payload.chunks(step).collect();
    let count = pieces.len().max(1);
    for i in 0..count {
        let piece = pieces.get(i).copied().unwrap_or_default();
        let last = i + 1 == count && !open;
        out.push((kind | if last { EOS } else { 0 }, piece.to_vec()));
    }
}

fn body_for(rng: &mut Rng, path: &str, model: &str) -> Value {
    let chat = path == "/v1/chat/completions";
    if (chat || path == "/v1/completions") && !rng.one_in(4) {
        return json_gen::valid_request(rng, chat, model);
    }
    let mut body = match path {
        "/v1/chat/completions" => json_gen::request(rng, true),
        "/v1/tokenize" if rng.one_in(2) => json_gen::request(rng, true),
        "/v1/detokenize" => json!({"tokens": json_gen::field_value(rng, "stop_token_ids")}),
        _ => json_gen::request(rng, false),
    };
    if !rng.one_in(8) {
        body["model"] = Value::from(model);
    }
    body
}

fn generate(rng: &mut Rng) -> Vec<u8> {
    let sglang = rng.one_in(2);
    let (model, protocol, engine) = if sglang {
        ("s", Protocol::Sglang, SGLANG_ENGINE)
    } else {
        ("m", Protocol::Vllm, VLLM_ENGINE)
    };
    let path = *rng.pick(&PATHS);
    let mut out = Vec::new();
    let mut request_headers = vec![
        (":method", if path == "/v1/models" { "GET" } else { "POST" }.to_string()),
        (":path", path.to_string()),
    ];
    if rng.one_in(3) {
        request_headers.push((REQUEST_ID_HEADER, format!("req-{}", rng.below(100))));
    }
    if rng.one_in(4) {
        request_headers.push((SESSION_HEADER, "session".into()));
    }
    if rng.one_in(6) {
        request_headers.push((OBJECTIVE_HEADER, "critical".into()));
    }
    if rng.one_in(6) {
        request_headers.push(("@subset", if rng.one_in(2) { engine } else { "10.9.9.9:1" }.to_string()));
    }
    out.push((REQUEST_HEADERS, lines(&request_headers)));
    let body = serde_json::to_vec(&body_for(rng, path, model)).expect("JSON");
    let open = rng.one_in(10);
    chunks(rng, REQUEST_BODY, &body, open, &mut out);
    if rng.one_in(10) {
        out.push((REQUEST_TRAILERS, Vec::new()));
    }
    if rng.one_in(4) {
        let frames: Vec<u8> = (0..rng.size(4))
            .flat_map(|_| grpc_frame::encode(&engine_output::message(rng, protocol)))
            .collect();
        out.push((FANOUT, frames));
    }

    let mut response_headers = vec![
        (":status", if rng.one_in(10) { "503" } else { "200" }.to_string()),
        ("content-type", "application/grpc".to_string()),
    ];
    if rng.one_in(10) {
        response_headers.push(("grpc-status", "14".into()));
        response_headers.push(("grpc-message", "engine%20down".into()));
    }
    if rng.one_in(6) {
        let other = if sglang { VLLM_ENGINE } else { SGLANG_ENGINE };
        response_headers.push(("@upstream", if rng.one_in(2) { engine } else { other }.to_string()));
    }
    out.push((
        RESPONSE_HEADERS | if rng.one_in(12) { EOS } else { 0 },
        lines(&response_headers),
    ));
    let mut frames: Vec<u8> = (0..rng.size(5))
        .flat_map(|_| grpc_frame::encode(&engine_output::message(rng, protocol)))
        .collect();
    if !rng.one_in(4) {
        frames.extend(grpc_frame::encode(&engine_output::complete(
            protocol,
            vec![104, 105],
            "stop",
        )));
    }
    let open = !rng.one_in(3);
    chunks(rng, RESPONSE_BODY, &frames, open, &mut out);
    let status = match rng.below(6) {
        0 => "",
        1 => "8",
        _ => "0",
    };
    out.push((RESPONSE_TRAILERS, lines(&[("grpc-status", status.to_string())])));
    records::write(sglang as u8, &out)
}

fn mutate(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    if rng.one_in(3) {
        return records::mutate(rng, data, 8);
    }
    // Rewrite one request body record's JSON, as the request target does.
    let (header, existing) = records::read(data);
    let mut owned: Vec<(u8, Vec<u8>)> = existing.iter().map(|r| (r.kind, r.payload.to_vec())).collect();
    let bodies: Vec<usize> = (0..owned.len()).filter(|&i| owned[i].0 & 7 == REQUEST_BODY).collect();
    let &at = bodies.get(rng.below(bodies.len().max(1)))?;
    owned[at].1 = (super::request::TARGET.mutate)(rng, &owned[at].1)?;
    Some(records::write(header, &owned))
}

fn dictionary() -> Vec<&'static [u8]> {
    let mut tokens = json_gen::field_tokens();
    tokens.extend([
        &b":status: 200\n"[..],
        b"grpc-status: 0\n",
        b"grpc-status: 13\n",
        b":path: /v1/completions\n",
        b"@upstream: 10.0.0.2:50051\n",
        b"\x84\x00\x00",
        b"\x00\x00\x00\x00\x00",
    ]);
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_map_is_a_bijection_onto_256_chars() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), '\u{120}');
    }

    #[test]
    fn a_generated_completion_reaches_the_engine_and_back() {
        // A well-formed exchange answers the client: the stream ends done with status 200.
        let body = br#"{"model": "m", "prompt": "hi", "max_tokens": 2}"#.to_vec();
        let frames = grpc_frame::encode(&engine_output::complete(Protocol::Vllm, vec![104, 105], "stop"));
        let input = records::write(
            0,
            &[
                (
                    REQUEST_HEADERS,
                    lines(&[(":method", "POST".into()), (":path", "/v1/completions".into())]),
                ),
                (REQUEST_BODY | EOS, body),
                (RESPONSE_HEADERS, lines(&[(":status", "200".into())])),
                (RESPONSE_BODY, frames),
                (RESPONSE_TRAILERS, lines(&[("grpc-status", "0".into())])),
            ],
        );
        let (_, records) = records::read(&input);
        let mut stream = RequestStream::new(gateway().clone());
        for r in records {
            stream.process(message(r.kind, r.payload));
        }
        let summary = stream.summary();
        assert!(stream.is_done());
        assert_eq!((summary.status, summary.completion_tokens), (200, 2), "{summary:?}");
    }
}
