//! Where a streamed tool call's gateway CPU goes, next to the same-length plain stream: the requests of
//! `make bench`'s tool-stream and plain-stream workloads (a short chat, with and without one tool; a
//! 240-token answer that is a 221-token Hermes call then words, or only words) driven through a whole
//! `RequestStream` in process, one engine token per message as the simulator sends them, and split into
//! the request side's steps (JSON parse and validation, template rendering, tokenization) and the
//! response side's (parser alone per streamed token, the whole translation with its SSE events).
//!
//! `cargo run --release --example tool_stream_cost [MODEL_DIR]` (default: ~/.cache/extproc/models/
//! llama3-default, what `make bench` serves); a few seconds. Prints one line per step and, last, a JSON
//! object with the parser's CPU per streamed token (`make bench` reads it).

use std::path::PathBuf;
use std::sync::Arc;

use extproc_core::agent::{parser, OutputParser, PassThrough, ToolFormat};
use extproc_core::engine::Protocol;
use extproc_core::gateway::{Gateway, Limits, ServedModel};
use extproc_core::grpc_frame;
use extproc_core::openai::request::{parse_chat_request, PromptInput};
use extproc_core::pb::ext_proc::{
    processing_request::Request, HeaderMap, HeaderValue, HttpBody, HttpHeaders, ProcessingRequest,
};
use extproc_core::pb::vllm;
use extproc_core::routing::RouterConfig;
use extproc_core::stream::RequestStream;
use extproc_core::template::ChatInputs;
use prost::Message;
use serde_json::{json, Value};

/// The answer's length in tokens (load/loadgen/workloads.py's AGENT_ANSWER_TOKENS).
const ANSWER_TOKENS: usize = 240;
const TOOL_NAME: &str = "bench_lookup_order";
const WORDS: &[&str] = &[
    "order", "river", "green", "table", "quickly", "market", "window", "silver", "garden", "letter", "travel",
    "simple", "number", "mountain", "answer", "yellow", "station", "engine", "paper", "morning", "circle", "country",
    "energy", "history", "picture", "science", "summer", "teacher", "village", "weather",
];

/// The bench's tool (load/loadgen/workloads.py's BENCH_TOOL).
fn tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Look up an order and its shipment.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "items": {"type": "array", "items": {"type": "object"}},
                    "note": {"type": "string"},
                },
                "required": ["order_id"],
            },
        },
    })
}

/// The scripted answer: the bench's Hermes call (Python's json.dumps spacing).
fn tool_call_text() -> String {
    let items: Vec<String> = (0..6)
        .map(|i| {
            format!(
                "{{\"sku\": \"SKU-{i:04}\", \"quantity\": {}, \"gift\": {}, \"warehouse\": \"eu-west\"}}",
                i % 3 + 1,
                i % 2 == 0
            )
        })
        .collect();
    format!(
        "<tool_call>\n{{\"name\": \"{TOOL_NAME}\", \"arguments\": {{\"order_id\": \"ORD-2024-118833\", \"items\": \
         [{}], \"note\": \"Customer asked for delivery after six in the evening, leave at the reception desk if \
         absent.\"}}}}\n</tool_call>",
        items.join(", ")
    )
}

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize
    }

    fn words(&mut self, n: usize) -> String {
        let words: Vec<&str> = (0..n).map(|_| WORDS[self.next() % WORDS.len()]).collect();
        words.join(" ")
    }
}

/// Request `i`'s body: a 15-word system and 40-word user message, streamed, with or without the tool.
fn body(i: u64, with_tool: bool) -> Vec<u8> {
    let mut rng = Lcg(i * 2 + 1);
    let mut request = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": rng.words(15)},
            {"role": "user", "content": format!("{i} {}", rng.words(40))},
        ],
        "max_tokens": ANSWER_TOKENS,
        "stream": true,
    });
    if with_tool {
        request["tools"] = json!([tool()]);
    }
    serde_json::to_vec(&request).unwrap()
}

fn message(request: Request) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..Default::default()
    }
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
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
    message(Request::RequestHeaders(HttpHeaders {
        headers: Some(headers),
        end_of_stream,
    }))
}

/// The engine's messages for one answer: one token each, then the completion, gRPC-framed.
fn engine_messages(answer: &[u32]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = answer
        .iter()
        .enumerate()
        .map(|(n, &id)| {
            let chunk = vllm::GenerateStreamChunk {
                token_ids: vec![id],
                prompt_tokens: 100,
                completion_tokens: n as u32 + 1,
                ..Default::default()
            };
            let response = vllm::GenerateResponse {
                response: Some(vllm::generate_response::Response::Chunk(chunk)),
            };
            grpc_frame::encode(&response.encode_to_vec())
        })
        .collect();
    let complete = vllm::GenerateComplete {
        output_ids: Vec::new(),
        finish_reason: "length".into(),
        prompt_tokens: 100,
        completion_tokens: answer.len() as u32,
        ..Default::default()
    };
    let response = vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Complete(complete)),
    };
    out.push(grpc_frame::encode(&response.encode_to_vec()));
    out
}

/// CPU time this thread has used, in seconds (not wall time: on a shared machine a busy neighbour
/// stretches wall time, not CPU time).
fn cpu_s() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    t.sec as f64 + t.nsec as f64 * 1e-9
}

/// CPU µs per call of `f` over `n` calls (after a tenth as warm-up).
fn time_us(n: u64, mut f: impl FnMut(u64)) -> f64 {
    for i in 0..n / 10 {
        f(1_000_000 + i);
    }
    let began = cpu_s();
    for i in 0..n {
        f(i);
    }
    (cpu_s() - began) * 1e6 / n as f64
}

/// One whole request through the state machine: (request-side CPU µs, response-side CPU µs, reply bytes).
fn whole_request(gateway: &Arc<Gateway>, body: Vec<u8>, engine: &[Vec<u8>]) -> (f64, f64, usize) {
    let began = cpu_s();
    let mut s = RequestStream::new(gateway.clone());
    s.process(headers(
        &[(":method", "POST"), (":path", "/v1/chat/completions")],
        false,
    ));
    let routed = s.process(message(Request::RequestBody(HttpBody {
        body,
        end_of_stream: true,
    })));
    assert!(!routed.is_empty());
    let request_us = (cpu_s() - began) * 1e6;
    let began = cpu_s();
    let mut bytes = 0;
    s.process(message(Request::ResponseHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: [(":status", "200"), ("content-type", "application/grpc")]
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: k.to_string(),
                    value: String::new(),
                    raw_value: v.as_bytes().to_vec(),
                })
                .collect(),
        }),
        end_of_stream: false,
    })));
    for (k, frame) in engine.iter().enumerate() {
        let replies = s.process(message(Request::ResponseBody(HttpBody {
            body: frame.clone(),
            end_of_stream: k + 1 == engine.len(),
        })));
        bytes += replies.iter().map(|r| r.encoded_len()).sum::<usize>();
    }
    (request_us, (cpu_s() - began) * 1e6, bytes)
}

fn main() {
    let dir = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/extproc/models/llama3-default")
    });
    let gateway = Arc::new(Gateway::new(Limits::default()));
    let model: Arc<ServedModel> = gateway
        .add_model("m", &dir, None, "round_robin", RouterConfig::default())
        .expect("model loads");
    model.set_parsers(Some("hermes"), None).expect("hermes parser");
    model
        .set_endpoints(vec![("10.0.0.1:50051".into(), 0, Protocol::Vllm, 1)])
        .unwrap();
    let tokenizer = &model.files.tokenizer;

    // The answers: the call then words, and words only, both ANSWER_TOKENS tokens.
    let filler = Lcg(99).words(400);
    let mut tool_answer = tokenizer.encode(&tool_call_text()).unwrap();
    let call_tokens = tool_answer.len();
    tool_answer.extend(tokenizer.encode(&format!(" {filler}")).unwrap());
    tool_answer.truncate(ANSWER_TOKENS);
    let mut plain_answer = tokenizer.encode(&filler).unwrap();
    plain_answer.truncate(ANSWER_TOKENS);
    println!("answers: {ANSWER_TOKENS} tokens each; the call is {call_tokens}");

    let n = 2000;
    for (label, with_tool) in [("plain", false), ("tool ", true)] {
        let parse = time_us(n, |i| {
            parse_chat_request(&body(i, with_tool)).unwrap();
        });
        let build = time_us(n, |i| {
            body(i, with_tool);
        });
        let request = parse_chat_request(&body(0, with_tool)).unwrap();
        let PromptInput::Chat(chat) = &request.input else {
            unreachable!()
        };
        let inputs = || ChatInputs {
            messages: &chat.messages,
            tools: chat.tools.as_ref(),
            documents: None,
            add_generation_prompt: true,
            continue_final_message: None,
            special_tokens: None,
            kwargs: Some(&chat.chat_template_kwargs),
        };
        let render = time_us(n, |_| {
            model.files.render_chat(None, inputs()).unwrap();
        });
        let text = model.files.render_chat(None, inputs()).unwrap();
        let prompt_tokens = tokenizer.encode_uncached(&text).unwrap().len();
        let tokenize = time_us(n, |_| {
            tokenizer.encode_uncached(&text).unwrap();
        });
        println!(
            "{label}: parse+validate {:.1} µs, render {render:.1} µs, tokenize {tokenize:.1} µs \
             ({prompt_tokens} prompt tokens, {:.3} µs/token, {} bytes)",
            parse - build,
            tokenize / prompt_tokens as f64,
            text.len(),
        );
    }

    // The parser alone over the answers' per-token text (what the detokenizer hands it).
    let pieces = |ids: &[u32]| -> Vec<String> {
        let mut out = Vec::new();
        let mut sent = 0;
        for k in 1..=ids.len() {
            let text = tokenizer.decode(&ids[..k], false);
            if text.len() > sent && text.is_char_boundary(sent) {
                out.push(text[sent..].to_string());
                sent = text.len();
            }
        }
        out
    };
    let tool_pieces = pieces(&tool_answer);
    let plain_pieces = pieces(&plain_answer);
    let declared: Arc<std::collections::HashSet<String>> = Arc::new([TOOL_NAME.to_string()].into());
    let run = |texts: &[String], make: &dyn Fn() -> Box<dyn OutputParser>| {
        let mut parser = make();
        let mut count = 0;
        for t in texts {
            let parsed = parser.push(t);
            count += parsed.calls.len() + parsed.content.len();
        }
        count + parser.finish().calls.len()
    };
    let hermes = || {
        let mut p = parser(Some(ToolFormat::Hermes), None, false);
        p.stream_calls(Some(declared.clone()));
        p
    };
    let passthrough = || Box::new(PassThrough) as Box<dyn OutputParser>;
    let n_parse = 4000;
    let hermes_us = time_us(n_parse, |_| {
        std::hint::black_box(run(&tool_pieces, &hermes));
    });
    let plain_us = time_us(n_parse, |_| {
        std::hint::black_box(run(&plain_pieces, &passthrough));
    });
    let per_token = |us: f64| 1000.0 * us / ANSWER_TOKENS as f64;
    println!(
        "parser alone: hermes over the call {hermes_us:.1} µs/answer ({:.0} ns/token), \
         pass-through over words {plain_us:.1} µs ({:.0} ns/token)",
        per_token(hermes_us),
        per_token(plain_us),
    );

    // Whole requests through the state machine.
    let engine_tool = engine_messages(&tool_answer);
    let engine_plain = engine_messages(&plain_answer);
    let mut rows = Vec::new();
    for (label, with_tool, engine) in [("plain", false, &engine_plain), ("tool ", true, &engine_tool)] {
        let mut req = Vec::new();
        let mut resp = Vec::new();
        let mut bytes = 0;
        for i in 0..n {
            let (a, b, c) = whole_request(&gateway, body(i, with_tool), engine);
            req.push(a);
            resp.push(b);
            bytes = c;
        }
        for v in [&mut req, &mut resp] {
            v.sort_by(f64::total_cmp);
        }
        let (rq, rs) = (req[req.len() / 2], resp[resp.len() / 2]);
        println!(
            "{label}: whole request (median) request side {rq:.1} µs, response side {rs:.1} µs \
             ({:.2} µs/token), {bytes} reply bytes",
            rs / ANSWER_TOKENS as f64
        );
        rows.push((rq, rs));
    }
    let (plain_total, tool_total) = (rows[0].0 + rows[0].1, rows[1].0 + rows[1].1);
    println!(
        "tool/plain in-process CPU: {:.2} ({tool_total:.0} / {plain_total:.0} µs)",
        tool_total / plain_total
    );
    println!(
        "{}",
        json!({
            "parser_ns_per_token": per_token(hermes_us),
            "passthrough_ns_per_token": per_token(plain_us),
            "tool_request_us": tool_total,
            "plain_request_us": plain_total,
        })
    );
}
