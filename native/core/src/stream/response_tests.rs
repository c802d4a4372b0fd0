//! The translator over hand-built engine messages: n choices, stop strings per choice, logprobs.

use std::sync::{Arc, OnceLock};

use prost::Message;
use serde_json::Value;

use super::response::{ResponseShape, ResponseTranslator};
use super::test_model::llama3_model_dir;
use crate::engine::Protocol;
use crate::gateway::{Gateway, Limits, ServedModel};
use crate::grpc_frame;
use crate::openai::request::Api;
use crate::openai::response::ResponseMeta;
use crate::pb::{sglang, vllm};
use crate::routing::RouterConfig;

/// One model for every test (they run in parallel; the directory is written once).
fn model() -> Arc<ServedModel> {
    static MODEL: OnceLock<Arc<ServedModel>> = OnceLock::new();
    MODEL.get_or_init(load_model).clone()
}

fn load_model() -> Arc<ServedModel> {
    let dir = llama3_model_dir("translator");
    let gateway = Gateway::new(Limits {
        max_body_bytes: 1 << 20,
        max_engine_message: 1 << 20,
        destination_fallbacks: 0,
    });
    gateway
        .add_model("m", &dir, Some(4096), "round_robin", RouterConfig::default())
        .unwrap()
}

/// A token that ends a choice in these tests (a stop token id of the request: "!").
const STOP_TOKEN: u32 = 0;

fn ids(model: &ServedModel, text: &str) -> Vec<u32> {
    model.files.tokenizer.encode(text).unwrap()
}

struct Setup {
    api: Api,
    protocol: Protocol,
    stream: bool,
    n: u32,
    stop: Vec<String>,
    logprobs: Option<u32>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            api: Api::Completion,
            protocol: Protocol::Vllm,
            stream: true,
            n: 1,
            stop: Vec::new(),
            logprobs: None,
        }
    }
}

fn translator(model: &Arc<ServedModel>, s: Setup) -> ResponseTranslator {
    let shape = ResponseShape {
        meta: ResponseMeta {
            api: s.api,
            id: "cmpl-1".into(),
            created: 1,
            model: "m".into(),
        },
        protocol: s.protocol,
        stream: s.stream,
        include_usage: true,
        skip_special_tokens: true,
        stop: s.stop,
        include_stop_str_in_output: false,
        stop_token_ids: vec![STOP_TOKEN],
        echo: None,
        n: s.n,
        logprobs: s.logprobs,
    };
    ResponseTranslator::new(model.clone(), shape, 1 << 20)
}

fn lp(ids: &[u32]) -> vllm::OutputLogProbs {
    vllm::OutputLogProbs {
        token_logprobs: ids.iter().map(|&i| -(i as f32) / 1000.0).collect(),
        token_ids: ids.to_vec(),
        top_logprobs: ids
            .iter()
            .map(|&i| vllm::TopLogProbs {
                values: vec![-0.1, -0.2, -0.3],
                token_ids: vec![i, i + 1, i + 2],
            })
            .collect(),
    }
}

/// The same logprobs as SGLang's message: both engines lay `OutputLogProbs` out alike on the wire.
fn sglang_lp(lp: vllm::OutputLogProbs) -> sglang::OutputLogProbs {
    sglang::OutputLogProbs::decode(lp.encode_to_vec().as_slice()).unwrap()
}

fn chunk(protocol: Protocol, index: u32, tokens: &[u32], logprobs: bool) -> Vec<u8> {
    let output_logprobs = logprobs.then(|| lp(tokens));
    let bytes = match protocol {
        Protocol::Vllm => vllm::GenerateResponse {
            response: Some(vllm::generate_response::Response::Chunk(vllm::GenerateStreamChunk {
                token_ids: tokens.to_vec(),
                prompt_tokens: 5,
                completion_tokens: tokens.len() as u32,
                cached_tokens: 2,
                output_logprobs,
                index,
            })),
        }
        .encode_to_vec(),
        Protocol::Sglang => sglang::GenerateResponse {
            request_id: "r".into(),
            response: Some(sglang::generate_response::Response::Chunk(
                sglang::GenerateStreamChunk {
                    token_ids: tokens.to_vec(),
                    prompt_tokens: 5,
                    completion_tokens: 99,
                    cached_tokens: 2,
                    output_logprobs: output_logprobs.map(sglang_lp),
                    index,
                },
            )),
        }
        .encode_to_vec(),
    };
    grpc_frame::encode(&bytes)
}

fn complete(protocol: Protocol, index: u32, tokens: &[u32], reason: &str, logprobs: bool) -> Vec<u8> {
    let output_logprobs = logprobs.then(|| lp(tokens));
    let bytes = match protocol {
        Protocol::Vllm => vllm::GenerateResponse {
            response: Some(vllm::generate_response::Response::Complete(vllm::GenerateComplete {
                output_ids: tokens.to_vec(),
                finish_reason: reason.into(),
                prompt_tokens: 5,
                completion_tokens: tokens.len() as u32,
                cached_tokens: 2,
                output_logprobs,
                index,
                ..Default::default()
            })),
        }
        .encode_to_vec(),
        Protocol::Sglang => sglang::GenerateResponse {
            request_id: "r".into(),
            response: Some(sglang::generate_response::Response::Complete(
                sglang::GenerateComplete {
                    output_ids: tokens.to_vec(),
                    finish_reason: reason.into(),
                    prompt_tokens: 5,
                    completion_tokens: tokens.len() as u32,
                    cached_tokens: 2,
                    output_logprobs: output_logprobs.map(sglang_lp),
                    index,
                },
            )),
        }
        .encode_to_vec(),
    };
    grpc_frame::encode(&bytes)
}

fn events(sse: &[u8]) -> Vec<Value> {
    std::str::from_utf8(sse)
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.is_empty() && *e != "data: [DONE]")
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect()
}

/// Streamed text per choice index, and each choice's finish reason.
fn per_index(events: &[Value], n: usize) -> (Vec<String>, Vec<Option<String>>) {
    let mut texts = vec![String::new(); n];
    let mut reasons = vec![None; n];
    for e in events {
        for c in e["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            let text = c["text"]
                .as_str()
                .or_else(|| c["delta"]["content"].as_str())
                .unwrap_or("");
            texts[i].push_str(text);
            if let Some(r) = c["finish_reason"].as_str() {
                assert!(reasons[i].is_none(), "one finish per choice");
                reasons[i] = Some(r.to_string());
            }
        }
    }
    (texts, reasons)
}

#[test]
fn n_choices_stream_under_their_own_index_and_usage_sums_them() {
    let m = model();
    for protocol in [Protocol::Vllm, Protocol::Sglang] {
        let mut t = translator(
            &m,
            Setup {
                protocol,
                n: 3,
                ..Setup::default()
            },
        );
        let texts = ["alpha beta", "gamma", "delta epsilon zeta"];
        let tokens: Vec<Vec<u32>> = texts.iter().map(|x| ids(&m, x)).collect();
        let mut sse = Vec::new();
        // Interleaved, one token at a time, choices finishing in a different order than their index.
        let longest = tokens.iter().map(Vec::len).max().unwrap();
        for step in 0..longest {
            for (i, toks) in tokens.iter().enumerate().rev() {
                if let Some(&tok) = toks.get(step) {
                    sse.extend(t.push(&chunk(protocol, i as u32, &[tok], false)).unwrap());
                    if step + 1 == toks.len() {
                        sse.extend(t.push(&complete(protocol, i as u32, &[tok], "length", false)).unwrap());
                    }
                }
            }
        }
        assert!(t.all_finished());
        sse.extend(t.finish());
        let evs = events(&sse);
        assert!(evs.iter().all(|e| e["choices"].as_array().unwrap().len() <= 1));
        let (got, reasons) = per_index(&evs, 3);
        assert_eq!(got, texts, "{protocol}");
        assert!(reasons.iter().all(|r| r.as_deref() == Some("length")));
        let usage = &evs.last().unwrap()["usage"];
        let total: usize = tokens.iter().map(Vec::len).sum();
        assert_eq!(usage["completion_tokens"], total as u64, "{protocol}");
        assert_eq!(usage["prompt_tokens"], 5);
        assert_eq!(t.finish_reason().as_deref(), Some("length,length,length"));
    }
}

#[test]
fn non_streamed_choices_come_in_index_order_with_summed_usage() {
    let m = model();
    for protocol in [Protocol::Vllm, Protocol::Sglang] {
        let mut t = translator(
            &m,
            Setup {
                protocol,
                stream: false,
                n: 2,
                api: Api::Chat,
                ..Setup::default()
            },
        );
        let (a, b) = (ids(&m, "first answer"), ids(&m, "second"));
        assert!(t.push(&complete(protocol, 1, &b, "stop", false)).unwrap().is_empty());
        assert!(!t.all_finished());
        t.push(&complete(protocol, 0, &a, "length", false)).unwrap();
        let v: Value = serde_json::from_slice(&t.finish()).unwrap();
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2);
        assert_eq!(choices[0]["index"], 0);
        assert_eq!(choices[0]["message"]["content"], "first answer");
        assert_eq!(choices[0]["finish_reason"], "length");
        assert_eq!(choices[1]["message"]["content"], "second");
        assert_eq!(choices[1]["finish_reason"], "stop");
        assert!(choices[0]["logprobs"].is_null());
        assert_eq!(v["usage"]["completion_tokens"], (a.len() + b.len()) as u64);
    }
}

#[test]
fn a_choice_index_beyond_n_is_an_engine_error() {
    let m = model();
    let mut t = translator(&m, Setup::default());
    let e = t.push(&chunk(Protocol::Vllm, 1, &[100], false)).unwrap_err();
    assert_eq!(e.status, 500);
}

#[test]
fn stop_strings_are_caught_per_choice_across_chunks() {
    let m = model();
    let mut t = translator(
        &m,
        Setup {
            n: 2,
            stop: vec!["STOP".into()],
            ..Setup::default()
        },
    );
    // Choice 0 says "one STOP two" a token at a time; choice 1 has "S" "TO" without the final "P".
    let zero = ids(&m, "one STOP two");
    let one = ids(&m, "keep STO going");
    let mut sse = Vec::new();
    for i in 0..zero.len().max(one.len()) {
        if let Some(&tok) = zero.get(i) {
            sse.extend(t.push(&chunk(Protocol::Vllm, 0, &[tok], false)).unwrap());
        }
        if let Some(&tok) = one.get(i) {
            sse.extend(t.push(&chunk(Protocol::Vllm, 1, &[tok], false)).unwrap());
        }
    }
    sse.extend(t.push(&complete(Protocol::Vllm, 0, &[], "length", false)).unwrap());
    sse.extend(t.push(&complete(Protocol::Vllm, 1, &[], "length", false)).unwrap());
    sse.extend(t.finish());
    let (texts, reasons) = per_index(&events(&sse), 2);
    assert_eq!(texts, ["one ", "keep STO going"]);
    assert_eq!(reasons, [Some("stop".to_string()), Some("length".to_string())]);
}

#[test]
fn chat_logprobs_have_openai_shape_streamed_and_not() {
    let m = model();
    let tokens = ids(&m, "Hi there");
    for stream in [true, false] {
        let mut t = translator(
            &m,
            Setup {
                api: Api::Chat,
                protocol: Protocol::Sglang,
                stream,
                logprobs: Some(2),
                ..Setup::default()
            },
        );
        let mut out = Vec::new();
        if stream {
            for &tok in &tokens {
                out.extend(t.push(&chunk(Protocol::Sglang, 0, &[tok], true)).unwrap());
            }
            out.extend(t.push(&complete(Protocol::Sglang, 0, &tokens, "stop", true)).unwrap());
        } else {
            t.push(&complete(Protocol::Sglang, 0, &tokens, "stop", true)).unwrap();
        }
        out.extend(t.finish());
        let content: Vec<Value> = if stream {
            events(&out)
                .iter()
                .flat_map(|e| e["choices"].as_array().unwrap().clone())
                .filter(|c| !c["logprobs"].is_null())
                .flat_map(|c| c["logprobs"]["content"].as_array().unwrap().clone())
                .collect()
        } else {
            let v: Value = serde_json::from_slice(&out).unwrap();
            v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone()
        };
        assert_eq!(content.len(), tokens.len(), "stream={stream}");
        let text: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(text, "Hi there");
        for (entry, &id) in content.iter().zip(&tokens) {
            let token = entry["token"].as_str().unwrap();
            let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
            assert_eq!(bytes, token.as_bytes());
            assert!((entry["logprob"].as_f64().unwrap() + id as f64 / 1000.0).abs() < 1e-4);
            let top = entry["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 2, "top_logprobs=2 alternatives");
            assert_eq!(top[0]["token"], token);
            assert!(top[1]["bytes"].is_array());
        }
    }
}

#[test]
fn completion_logprobs_have_parallel_lists_and_text_offsets() {
    let m = model();
    let tokens = ids(&m, "Hello big world");
    let mut t = translator(
        &m,
        Setup {
            stream: false,
            logprobs: Some(1),
            ..Setup::default()
        },
    );
    t.push(&complete(Protocol::Vllm, 0, &tokens, "length", true)).unwrap();
    let v: Value = serde_json::from_slice(&t.finish()).unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let strs: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(strs.concat(), "Hello big world");
    let offsets: Vec<u64> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    let mut expected = Vec::new();
    let mut at = 0;
    for s in &strs {
        expected.push(at);
        at += s.chars().count() as u64;
    }
    assert_eq!(offsets, expected);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
    for (top, s) in lp["top_logprobs"].as_array().unwrap().iter().zip(&strs) {
        let top = top.as_object().unwrap();
        assert!(top.contains_key(*s), "the sampled token is among its alternatives");
        assert!(top.len() <= 2);
    }
}

#[test]
fn a_stop_token_ends_the_text_without_being_part_of_it() {
    let m = model();
    for stream in [true, false] {
        let mut t = translator(
            &m,
            Setup {
                stream,
                ..Setup::default()
            },
        );
        let mut tokens = ids(&m, "all done");
        tokens.push(STOP_TOKEN);
        let mut out = Vec::new();
        if stream {
            out.extend(t.push(&chunk(Protocol::Vllm, 0, &tokens, false)).unwrap());
            out.extend(
                t.push(&complete(Protocol::Vllm, 0, &[STOP_TOKEN], "stop", false))
                    .unwrap(),
            );
        } else {
            t.push(&complete(Protocol::Vllm, 0, &tokens, "stop", false)).unwrap();
        }
        out.extend(t.finish());
        let text = if stream {
            per_index(&events(&out), 1).0.remove(0)
        } else {
            let v: Value = serde_json::from_slice(&out).unwrap();
            v["choices"][0]["text"].as_str().unwrap().to_string()
        };
        assert_eq!(text, "all done", "stream={stream}");
        assert_eq!(
            t.usage.completion_tokens,
            tokens.len() as u32,
            "the stop token still counts"
        );
    }
}
