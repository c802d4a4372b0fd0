//! Both protocols' encodings against hand-built messages of the real field layouts.

use prost::Message;

use super::{GenerateCall, Output, Protocol, TokenLogprob};
use crate::openai::request::{Constraint, Sampling};
use crate::pb::{sglang, vllm};

fn call(sampling: &Sampling) -> GenerateCall<'_> {
    GenerateCall {
        request_id: "req-1",
        input_ids: vec![5, 6, 7],
        sampling,
        constraint: None,
        include_stop_str_in_output: true,
        stream: true,
        data_parallel_rank: None,
    }
}

fn sampling() -> Sampling {
    Sampling {
        n: 1,
        skip_special_tokens: true,
        ..Sampling::default()
    }
}

#[test]
fn sglang_gets_its_own_defaults_for_what_the_client_left_out() {
    let bytes = Protocol::Sglang.encode_generate(call(&sampling()));
    let r = sglang::GenerateRequest::decode(bytes.as_slice()).unwrap();
    let p = r.sampling_params.unwrap();
    assert_eq!((p.temperature, p.top_p, p.top_k), (1.0, 1.0, -1));
    assert_eq!((p.min_p, p.repetition_penalty, p.frequency_penalty), (0.0, 1.0, 0.0));
    assert_eq!(p.max_new_tokens, None);
    assert_eq!(p.n, 1);
    assert!(p.no_stop_trim && p.skip_special_tokens && p.spaces_between_special_tokens);
    assert_eq!(r.tokenized.unwrap().input_ids, [5, 6, 7]);
    assert_eq!(r.request_id, "req-1");
    assert!(r.stream);
    assert!(!r.return_logprob);
    assert_eq!(r.logprob_start_len, -1, "no prompt logprobs");
}

#[test]
fn sglang_carries_what_the_client_gave() {
    let s = Sampling {
        temperature: Some(0.0),
        top_p: Some(0.5),
        top_k: Some(40),
        repetition_penalty: Some(1.2),
        max_tokens: Some(9),
        min_tokens: 2,
        stop: vec!["END".into()],
        logit_bias: vec![(17, -100.0)],
        n: 3,
        logprobs: Some(4),
        ..sampling()
    };
    let r = sglang::GenerateRequest::decode(Protocol::Sglang.encode_generate(call(&s)).as_slice()).unwrap();
    let p = r.sampling_params.unwrap();
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.repetition_penalty),
        (0.0, 0.5, 40, 1.2)
    );
    assert_eq!((p.max_new_tokens, p.min_new_tokens, p.n), (Some(9), 2, 3));
    assert_eq!(p.stop, ["END"]);
    assert_eq!(p.logit_bias.get("17"), Some(&-100.0));
    assert!(r.return_logprob);
    assert_eq!((r.top_logprobs_num, r.logprob_start_len), (4, -1));
    // "no top-k" is -1 in SGLang, whichever way the client said it.
    for k in [0, -1] {
        let s = Sampling {
            top_k: Some(k),
            ..sampling()
        };
        let r = sglang::GenerateRequest::decode(Protocol::Sglang.encode_generate(call(&s)).as_slice()).unwrap();
        assert_eq!(r.sampling_params.unwrap().top_k, -1);
    }
}

#[test]
fn vllm_keeps_unset_fields_unset_and_asks_for_n_and_logprobs() {
    let r = vllm::GenerateRequest::decode(Protocol::Vllm.encode_generate(call(&sampling())).as_slice()).unwrap();
    // Token ids, as the `tokenized` member of vLLM's `input` oneof.
    let Some(vllm::generate_request::Input::Tokenized(input)) = r.input else {
        panic!("no tokenized input: {:?}", r.input)
    };
    assert_eq!(input.input_ids, [5, 6, 7]);
    let p = r.sampling_params.unwrap();
    assert_eq!((p.temperature, p.top_p, p.top_k, p.logprobs), (None, 0.0, 0, None));
    let s = Sampling {
        temperature: Some(0.7),
        n: 4,
        logprobs: Some(0),
        seed: Some(11),
        ..sampling()
    };
    let r = vllm::GenerateRequest::decode(Protocol::Vllm.encode_generate(call(&s)).as_slice()).unwrap();
    let p = r.sampling_params.unwrap();
    assert_eq!(
        (p.temperature, p.n, p.logprobs, p.seed),
        (Some(0.7), 4, Some(0), Some(11))
    );
    assert!(p.include_stop_str_in_output);
}

/// The field's varint key bytes followed by the value `v` (< 128), as protobuf writes them.
fn varint_field(tag: u32, v: u8) -> Vec<u8> {
    let mut key = tag << 3;
    let mut out = Vec::new();
    while key >= 0x80 {
        out.push((key as u8) | 0x80);
        key >>= 7;
    }
    out.push(key as u8);
    out.push(v);
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_pinned_rank_travels_as_data_parallel_rank_in_both_protocols() {
    let s = sampling();
    for rank in [0u32, 1, 3] {
        let pinned = |protocol: Protocol| {
            protocol.encode_generate(GenerateCall {
                data_parallel_rank: Some(rank),
                ..call(&s)
            })
        };
        let v = pinned(Protocol::Vllm);
        assert_eq!(
            vllm::GenerateRequest::decode(v.as_slice()).unwrap().data_parallel_rank,
            Some(rank as i32)
        );
        // vllm_engine.proto: `optional int32 data_parallel_rank = 9`.
        assert!(contains(&v, &varint_field(9, rank as u8)), "{v:?}");
        let g = pinned(Protocol::Sglang);
        assert_eq!(
            sglang::GenerateRequest::decode(g.as_slice())
                .unwrap()
                .data_parallel_rank,
            Some(rank as i32)
        );
        // sglang_scheduler.proto: `optional int32 data_parallel_rank = 16` (a two-byte key).
        assert!(contains(&g, &varint_field(16, rank as u8)), "{g:?}");
    }
    // Unpinned: the field is absent (the engine balances over its ranks).
    let v = Protocol::Vllm.encode_generate(call(&s));
    assert_eq!(
        vllm::GenerateRequest::decode(v.as_slice()).unwrap().data_parallel_rank,
        None
    );
    let g = Protocol::Sglang.encode_generate(call(&s));
    assert_eq!(
        sglang::GenerateRequest::decode(g.as_slice())
            .unwrap()
            .data_parallel_rank,
        None
    );
}

fn logprobs() -> vllm::OutputLogProbs {
    vllm::OutputLogProbs {
        token_logprobs: vec![-0.5, -1.5],
        token_ids: vec![10, 11],
        top_logprobs: vec![
            // Unsorted (vLLM's servicer lists the sampled token first): decoded most likely first.
            vllm::TopLogProbs {
                values: vec![-2.0, -0.5],
                token_ids: vec![12, 10],
            },
            vllm::TopLogProbs {
                values: vec![-1.0],
                token_ids: vec![13],
            },
        ],
    }
}

/// The same logprobs as SGLang's message: both engines lay `OutputLogProbs` out alike on the wire.
fn sglang_logprobs() -> sglang::OutputLogProbs {
    sglang::OutputLogProbs::decode(logprobs().encode_to_vec().as_slice()).unwrap()
}

fn expected_logprobs() -> Vec<TokenLogprob> {
    vec![
        TokenLogprob {
            id: 10,
            logprob: -0.5,
            top: vec![(10, -0.5), (12, -2.0)],
        },
        TokenLogprob {
            id: 11,
            logprob: -1.5,
            top: vec![(13, -1.0)],
        },
    ]
}

#[test]
fn both_protocols_decode_chunks_with_index_and_logprobs() {
    let v = vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Chunk(vllm::GenerateStreamChunk {
            token_ids: vec![10, 11],
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
            output_logprobs: Some(logprobs()),
            index: 2,
        })),
    };
    let s = sglang::GenerateResponse {
        request_id: "req-1".into(),
        response: Some(sglang::generate_response::Response::Chunk(
            sglang::GenerateStreamChunk {
                token_ids: vec![10, 11],
                prompt_tokens: 3,
                completion_tokens: 7, // cumulative in SGLang: never used as a delta
                cached_tokens: 1,
                output_logprobs: Some(sglang_logprobs()),
                index: 2,
            },
        )),
    };
    let expected = Output {
        index: 2,
        token_ids: vec![10, 11],
        logprobs: expected_logprobs(),
        prompt_tokens: 3,
        cached_tokens: 1,
        finish_reason: None,
    };
    let from_vllm = Protocol::Vllm.decode_response(&v.encode_to_vec(), true).unwrap();
    let from_sglang = Protocol::Sglang.decode_response(&s.encode_to_vec(), true).unwrap();
    assert_eq!(from_vllm.as_ref(), Some(&expected));
    assert_eq!(from_sglang.as_ref(), Some(&expected));
}

#[test]
fn a_streamed_complete_repeats_nothing_a_final_one_carries_everything() {
    let v = vllm::GenerateResponse {
        response: Some(vllm::generate_response::Response::Complete(vllm::GenerateComplete {
            output_ids: vec![10, 11],
            finish_reason: "length".into(),
            prompt_tokens: 3,
            completion_tokens: 2,
            output_logprobs: Some(logprobs()),
            index: 1,
            ..Default::default()
        })),
    };
    let s = sglang::GenerateResponse {
        request_id: "req-1".into(),
        response: Some(sglang::generate_response::Response::Complete(
            sglang::GenerateComplete {
                output_ids: vec![10, 11],
                finish_reason: "length".into(),
                prompt_tokens: 3,
                completion_tokens: 2,
                output_logprobs: Some(sglang_logprobs()),
                index: 1,
                ..Default::default()
            },
        )),
    };
    for (protocol, bytes) in [
        (Protocol::Vllm, v.encode_to_vec()),
        (Protocol::Sglang, s.encode_to_vec()),
    ] {
        let streamed = protocol.decode_response(&bytes, true).unwrap().unwrap();
        assert!(
            streamed.token_ids.is_empty() && streamed.logprobs.is_empty(),
            "{protocol}"
        );
        assert_eq!((streamed.index, streamed.finish_reason.as_deref()), (1, Some("length")));
        let whole = protocol.decode_response(&bytes, false).unwrap().unwrap();
        assert_eq!(whole.token_ids, [10, 11], "{protocol}");
        assert_eq!(whole.logprobs, expected_logprobs(), "{protocol}");
    }
}

#[test]
fn aborts_name_the_right_service_and_message() {
    let (path, body) = Protocol::Vllm.abort("req-9");
    assert_eq!(path, "/vllm.grpc.engine.VllmEngine/Abort");
    assert_eq!(
        vllm::AbortRequest::decode(body.as_slice()).unwrap().request_ids,
        ["req-9"]
    );
    let (path, body) = Protocol::Sglang.abort("req-9");
    assert_eq!(path, "/sglang.grpc.scheduler.SglangScheduler/Abort");
    assert_eq!(
        sglang::AbortRequest::decode(body.as_slice()).unwrap().request_id,
        "req-9"
    );
    assert_eq!(
        Protocol::Sglang.generate_path(),
        "/sglang.grpc.scheduler.SglangScheduler/Generate"
    );
    assert_eq!(Protocol::Vllm.generate_path(), "/vllm.grpc.engine.VllmEngine/Generate");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for protocol in [Protocol::Vllm, Protocol::Sglang] {
        assert!(protocol.decode_response(&[0xff, 0xff, 0xff], true).is_err());
    }
}

#[test]
fn sglang_complete_with_logprobs_round_trips() {
    let s = sglang::GenerateResponse {
        request_id: "r".into(),
        response: Some(sglang::generate_response::Response::Complete(
            sglang::GenerateComplete {
                output_ids: vec![10, 11],
                finish_reason: "stop".into(),
                output_logprobs: Some(sglang_logprobs()),
                ..Default::default()
            },
        )),
    };
    let out = Protocol::Sglang
        .decode_response(&s.encode_to_vec(), false)
        .unwrap()
        .unwrap();
    assert_eq!(out.logprobs, expected_logprobs());
}

/// A length-delimited field: its key, its length and its bytes (short values only).
fn bytes_field(tag: u32, value: &[u8]) -> Vec<u8> {
    let mut key = Vec::new();
    let mut k = (tag << 3) | 2;
    while k >= 0x80 {
        key.push((k as u8 & 0x7f) | 0x80);
        k >>= 7;
    }
    key.push(k as u8);
    key.push(value.len() as u8);
    key.extend_from_slice(value);
    key
}

#[test]
fn each_constraint_travels_in_each_protocols_own_field() {
    use sglang::sampling_params::Constraint as G;
    use vllm::sampling_params::Constraint as V;
    let s = sampling();
    let encode = |protocol: Protocol, c: &Constraint| {
        protocol.encode_generate(GenerateCall {
            constraint: Some(c),
            ..call(&s)
        })
    };
    let choice = Constraint::Choice(vec!["a.b".into(), "c".into()]);
    // (constraint, vLLM's field and number, SGLang's field and number) as in smg-grpc-proto.
    let cases = [
        (
            Constraint::JsonSchema("{}".into()),
            V::JsonSchema("{}".into()),
            16,
            G::JsonSchema("{}".into()),
            14,
        ),
        (
            Constraint::Regex("a+".into()),
            V::Regex("a+".into()),
            17,
            G::Regex("a+".into()),
            13,
        ),
        (
            Constraint::Grammar("g".into()),
            V::Grammar("g".into()),
            18,
            G::EbnfGrammar("g".into()),
            15,
        ),
        (
            Constraint::StructuralTag("t".into()),
            V::StructuralTag("t".into()),
            19,
            G::StructuralTag("t".into()),
            16,
        ),
    ];
    for (c, v, v_tag, g, g_tag) in cases {
        let vb = encode(Protocol::Vllm, &c);
        let vp = vllm::GenerateRequest::decode(vb.as_slice())
            .unwrap()
            .sampling_params
            .unwrap();
        assert_eq!(vp.constraint, Some(v.clone()), "{c:?}");
        let text = match &v {
            V::JsonSchema(t) | V::Regex(t) | V::Grammar(t) | V::StructuralTag(t) => t.clone(),
            V::Choice(_) => unreachable!(),
        };
        assert!(contains(&vb, &bytes_field(v_tag, text.as_bytes())), "{c:?}: {vb:?}");
        let gb = encode(Protocol::Sglang, &c);
        let gp = sglang::GenerateRequest::decode(gb.as_slice())
            .unwrap()
            .sampling_params
            .unwrap();
        assert_eq!(gp.constraint, Some(g), "{c:?}");
        assert!(contains(&gb, &bytes_field(g_tag, text.as_bytes())), "{c:?}: {gb:?}");
    }
    // vLLM has a choice field (21, a ChoiceConstraint); SGLang gets the regex of exactly those choices.
    let vb = encode(Protocol::Vllm, &choice);
    let vp = vllm::GenerateRequest::decode(vb.as_slice())
        .unwrap()
        .sampling_params
        .unwrap();
    let wanted = vllm::ChoiceConstraint {
        choices: vec!["a.b".into(), "c".into()],
    };
    assert_eq!(vp.constraint, Some(V::Choice(wanted.clone())));
    assert!(contains(&vb, &bytes_field(21, &wanted.encode_to_vec())));
    let gb = encode(Protocol::Sglang, &choice);
    let gp = sglang::GenerateRequest::decode(gb.as_slice())
        .unwrap()
        .sampling_params
        .unwrap();
    assert_eq!(gp.constraint, Some(G::Regex(r"(a\.b|c)".into())));
    // No constraint: neither protocol sends one.
    let none = |p: Protocol| p.encode_generate(call(&s));
    assert_eq!(
        vllm::GenerateRequest::decode(none(Protocol::Vllm).as_slice())
            .unwrap()
            .sampling_params
            .unwrap()
            .constraint,
        None
    );
    assert_eq!(
        sglang::GenerateRequest::decode(none(Protocol::Sglang).as_slice())
            .unwrap()
            .sampling_params
            .unwrap()
            .constraint,
        None
    );
}
