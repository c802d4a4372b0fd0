//! vLLM's ZMQ payloads, hand-built in msgpack (map and array forms, int and bytes hashes) and one captured
//! from a real engine; malformed input; and through the router: picks, shared state with the gRPC path,
//! gaps held for replay, duplicates, resets.

use prost::Message;
use rmpv::Value;

use super::*;
use crate::routing::{ApplyStats, EventOutcome, Router, RouterConfig};

const B: usize = 4;
const A: &str = "10.0.0.1:50051";
const OTHER: &str = "10.0.0.2:50051";

fn s(v: &str) -> Value {
    Value::from(v)
}

fn map(fields: Vec<(&str, Value)>) -> Value {
    Value::Map(fields.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn ints<T: Into<Value> + Copy>(items: &[T]) -> Value {
    Value::Array(items.iter().map(|&i| i.into()).collect())
}

fn pack(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

/// `[ts, events, dp_rank]`.
fn batch(events: Vec<Value>) -> Vec<u8> {
    pack(&Value::Array(vec![
        Value::F64(1.7e9),
        Value::Array(events),
        Value::from(0),
    ]))
}

/// Tokens of blocks made of one repeated token each.
fn toks(blocks: &[u32]) -> Vec<u32> {
    blocks.iter().flat_map(|&b| [b; B]).collect()
}

/// A map-form BlockStored as vLLM 0.32 sends it (defaults omitted), hashes as u64.
fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> Value {
    map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", ints(hashes)),
        ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
        ("token_ids", ints(tokens)),
        ("block_size", Value::from(B as u64)),
        ("lora_id", Value::Nil),
        ("medium", s("GPU")),
        ("lora_name", Value::Nil),
        ("extra_keys", Value::Array(vec![Value::Nil; hashes.len()])),
        ("group_idx", Value::from(0)),
        ("kv_cache_spec_kind", s("full_attention")),
    ])
}

fn removed(hashes: &[u64]) -> Value {
    map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", ints(hashes)),
        ("medium", s("GPU")),
        ("group_idx", Value::from(0)),
    ])
}

fn cleared() -> Value {
    map(vec![("type", s("AllBlocksCleared"))])
}

fn router() -> Router {
    let r = Router::new(
        "kv_events",
        RouterConfig {
            seed: Some(7),
            ..Default::default()
        },
    )
    .unwrap();
    r.set_endpoints(vec![(A.to_string(), B as u32), (OTHER.to_string(), B as u32)])
        .unwrap();
    r
}

fn apply(r: &Router, seq: u64, payload: &[u8]) -> &'static str {
    r.apply_zmq_kv_events(A, seq, payload).outcome.kind()
}

/// The most blocks of `tokens` any endpoint holds as the router sees it: A's, the only one given events
/// (the pick itself may go to the other, a fresh endpoint).
fn cached_on_a(r: &Router, tokens: &[u32]) -> u32 {
    r.pick(tokens, None).unwrap().best_cached_blocks
}

// A hash above i64::MAX: vLLM's u64 folds to the negative int64 SubscribeKvEvents carries.
const BIG: u64 = 0xaa02_54a6_3523_9545;

#[test]
fn map_form_stored_removed_cleared() {
    let payload = batch(vec![
        stored(&[BIG, 2], Some(9), &toks(&[1, 2])),
        removed(&[BIG]),
        cleared(),
    ]);
    let b = decode(41, &payload).unwrap();
    assert_eq!((b.sequence_number, b.timestamp, b.dp_rank), (41, 1.7e9, Some(0)));
    let Some(Data::Stored(st)) = &b.events[0].data else {
        panic!("{:?}", b.events[0])
    };
    let hashes: Vec<i64> = st.blocks.iter().map(|b| b.block_hash).collect();
    assert_eq!(hashes, vec![BIG as i64, 2]);
    assert!(hashes[0] < 0, "the signed int64 of the gRPC path");
    assert_eq!(st.parent_block_hash, Some(9));
    assert_eq!(st.blocks[0].token_ids, vec![1; B]);
    assert_eq!(st.blocks[1].token_ids, vec![2; B]);
    assert_eq!(st.tier, Some(pb::KvCacheTier::Device as i32));
    assert_eq!(
        (st.group_idx, st.kv_cache_spec_kind.as_deref()),
        (Some(0), Some("full_attention"))
    );
    assert_eq!((st.lora_name.as_deref(), st.cache_salt.as_deref()), (None, None));
    assert!(st.blocks.iter().all(|b| b.extra_keys.is_empty()));
    let Some(Data::Removed(rm)) = &b.events[1].data else {
        panic!()
    };
    assert_eq!(rm.block_hashes, vec![BIG as i64]);
    assert!(matches!(b.events[2].data, Some(Data::Cleared(_))));
}

#[test]
fn byte_hashes_fold_to_their_low_64_bits_big_endian() {
    let mut digest = vec![0xffu8; 24];
    digest.extend_from_slice(&BIG.to_be_bytes());
    let event = map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(vec![Value::Binary(digest), Value::Binary(vec![1, 2])]),
        ),
        ("medium", s("GPU")),
    ]);
    let b = decode(0, &batch(vec![event])).unwrap();
    let Some(Data::Removed(rm)) = &b.events[0].data else {
        panic!()
    };
    assert_eq!(rm.block_hashes, vec![BIG as i64, 0x0102]);
}

#[test]
fn array_form_of_older_releases() {
    // Tag first, then the fields in declaration order, trailing defaults cut.
    let st = Value::Array(vec![
        s("BlockStored"),
        ints(&[5u64]),
        Value::Nil,
        ints(&toks(&[3])),
        Value::from(B as u64),
        Value::Nil,
        s("GPU"),
    ]);
    let rm = Value::Array(vec![s("BlockRemoved"), ints(&[5u64]), s("CPU")]);
    let b = decode(3, &batch(vec![st, rm, Value::Array(vec![s("AllBlocksCleared")])])).unwrap();
    let Some(Data::Stored(st)) = &b.events[0].data else {
        panic!()
    };
    assert_eq!((st.blocks[0].block_hash, st.parent_block_hash), (5, None));
    assert_eq!(st.blocks[0].token_ids, vec![3; B]);
    let Some(Data::Removed(rm)) = &b.events[1].data else {
        panic!()
    };
    assert_eq!(
        rm.tier,
        Some(pb::KvCacheTier::Host as i32),
        "CPU medium: an offload tier"
    );
    assert!(matches!(b.events[2].data, Some(Data::Cleared(_))));
}

#[test]
fn extra_keys_carry_the_salt_and_multimodal_items() {
    let mut ev = stored(&[1, 2], None, &toks(&[1, 2]));
    let Value::Map(fields) = &mut ev else { panic!() };
    for (k, v) in fields.iter_mut() {
        if k.as_str() == Some("extra_keys") {
            *v = Value::Array(vec![
                Value::Array(vec![s("salt-1")]),
                Value::Array(vec![
                    Value::Array(vec![s("img-9"), Value::from(3)]),
                    Value::Binary(vec![7]),
                ]),
            ]);
        }
    }
    let b = decode(0, &batch(vec![ev])).unwrap();
    let Some(Data::Stored(st)) = &b.events[0].data else {
        panic!()
    };
    assert_eq!(st.cache_salt.as_deref(), Some("salt-1"));
    assert_eq!(st.blocks[1].extra_keys.len(), 2);
    assert!(matches!(
        &st.blocks[1].extra_keys[0].key,
        Some(Key::Multimodal(m)) if m.identifier == "img-9" && m.offset == 3
    ));
}

#[test]
fn unknown_event_types_are_left_out() {
    let b = decode(0, &batch(vec![map(vec![("type", s("BlockPinned"))]), cleared()])).unwrap();
    assert_eq!(b.events.len(), 1);
}

// A batch a real vLLM 0.32 engine published (CPU, 128-token blocks): the block its decoding filled after
// a 301-token prompt (tokens 1255-1299, then greedy repeats of 1299). Same bytes as
// tests/simulator/test_simulator_zmq.py's VLLM_PAYLOAD.
const VLLM_PAYLOAD: &str = concat!(
    "93cb41dac33bb3595e3d918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfaa0254a6",
    "35239545b1706172656e745f626c6f636b5f68617368cf4eda0804df5f246ea9746f6b656e5f696473dc0080cd04e7cd",
    "04e8cd04e9cd04eacd04ebcd04eccd04edcd04eecd04efcd04f0cd04f1cd04f2cd04f3cd04f4cd04f5cd04f6cd04f7cd",
    "04f8cd04f9cd04facd04fbcd04fccd04fdcd04fecd04ffcd0500cd0501cd0502cd0503cd0504cd0505cd0506cd0507cd",
    "0508cd0509cd050acd050bcd050ccd050dcd050ecd050fcd0510cd0511cd0512cd0513cd0513cd0513cd0513cd0513cd",
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd",
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd",
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd",
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd",
    "0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513cd0513aa626c6f",
    "636b5f73697a65cc80a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b",
    "65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e7469",
    "6f6e00",
);

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_payload_a_real_vllm_published() {
    let b = decode(7, &unhex(VLLM_PAYLOAD)).unwrap();
    assert_eq!(b.events.len(), 1);
    let Some(Data::Stored(st)) = &b.events[0].data else {
        panic!()
    };
    assert_eq!(st.blocks.len(), 1);
    let block = &st.blocks[0];
    assert_eq!(block.block_hash, 0xaa02_54a6_3523_9545u64 as i64);
    assert_eq!(st.parent_block_hash, Some(0x4eda_0804_df5f_246e));
    assert_eq!((block.block_size, block.token_ids.len()), (128, 128));
    assert_eq!(block.token_ids[..3], [1255, 1256, 1257]);
    assert!(block.token_ids[45..].iter().all(|&t| t == 1299));
    assert_eq!(st.tier, Some(pb::KvCacheTier::Device as i32));
    assert_eq!(st.kv_cache_spec_kind.as_deref(), Some("full_attention"));
}

#[test]
fn malformed_payloads_are_errors() {
    let good = batch(vec![cleared()]);
    let mut trailing = good.clone();
    trailing.push(0xc0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("not msgpack", vec![0xc1]),
        ("truncated", good[..good.len() - 1].to_vec()),
        ("trailing bytes", trailing),
        (
            "a map, not [ts, events, rank]",
            pack(&map(vec![("ts", Value::from(1))])),
        ),
        (
            "events not an array",
            pack(&Value::Array(vec![Value::from(1), Value::from(2)])),
        ),
        (
            "event without type",
            batch(vec![map(vec![("block_hashes", ints(&[1u64]))])]),
        ),
        ("event of a scalar", batch(vec![Value::from(3)])),
        (
            "hashes not an array",
            batch(vec![map(vec![
                ("type", s("BlockRemoved")),
                ("block_hashes", Value::from(1)),
            ])]),
        ),
        (
            "hash a string",
            batch(vec![map(vec![
                ("type", s("BlockRemoved")),
                ("block_hashes", Value::Array(vec![s("x")])),
            ])]),
        ),
        ("token id a string", {
            let mut ev = stored(&[1], None, &toks(&[1]));
            let Value::Map(f) = &mut ev else { panic!() };
            f[3].1 = Value::Array(vec![s("t"); B]);
            batch(vec![ev])
        }),
        (
            "no block_size",
            batch(vec![map(vec![
                ("type", s("BlockStored")),
                ("block_hashes", ints(&[1u64])),
                ("token_ids", ints(&toks(&[1]))),
            ])]),
        ),
        ("nested too deep", {
            let mut v = Value::Nil;
            for _ in 0..64 {
                v = Value::Array(vec![v]);
            }
            batch(vec![v])
        }),
    ];
    let r = router();
    for (what, payload) in cases {
        assert!(decode(0, &payload).is_err(), "{what}");
        assert_eq!(apply(&r, 0, &payload), "malformed", "{what}");
    }
}

#[test]
fn stored_chains_route_removed_and_cleared_drop() {
    let r = router();
    let p = toks(&[1, 2, 3]);
    assert_eq!(
        apply(&r, 10, &batch(vec![stored(&[BIG, 2], None, &p[..2 * B])])),
        "applied"
    );
    // The third block continues from the second through its engine hash.
    assert_eq!(
        apply(&r, 11, &batch(vec![stored(&[3], Some(2), &p[2 * B..])])),
        "applied"
    );
    assert_eq!(cached_on_a(&r, &p), 3);
    assert_eq!(apply(&r, 12, &batch(vec![removed(&[3])])), "applied");
    assert_eq!(cached_on_a(&r, &p), 2);
    assert_eq!(apply(&r, 13, &batch(vec![cleared()])), "applied");
    assert_eq!(cached_on_a(&r, &p), 0);
    assert_eq!(
        r.endpoints().iter().find(|e| &*e.address == A).unwrap().engine_blocks,
        0
    );
}

#[test]
fn a_child_of_an_unknown_parent_is_skipped() {
    let r = router();
    let res = r.apply_zmq_kv_events(A, 0, &batch(vec![stored(&[3], Some(99), &toks(&[3]))]));
    assert!(matches!(
        res.outcome,
        EventOutcome::Applied(ApplyStats {
            stored: 0,
            skipped: 1,
            ..
        })
    ));
}

#[test]
fn misaligned_tokens_and_offloaded_blocks_are_not_indexed() {
    let r = router();
    let p = toks(&[1, 2]);
    let short = stored(&[1, 2], None, &p[..B + 1]);
    let res = r.apply_zmq_kv_events(A, 0, &batch(vec![short]));
    assert!(matches!(
        res.outcome,
        EventOutcome::Applied(ApplyStats {
            stored: 0,
            skipped: 2,
            ..
        })
    ));
    let mut cpu = stored(&[1, 2], None, &p);
    let Value::Map(f) = &mut cpu else { panic!() };
    f[6].1 = s("CPU");
    assert_eq!(apply(&r, 1, &batch(vec![cpu])), "applied");
    assert_eq!(cached_on_a(&r, &p), 0);
}

#[test]
fn both_channels_share_the_endpoint_state() {
    // Stored over ZMQ (u64 hash), Removed over gRPC (the same hash as int64), next sequence.
    let r = router();
    let p = toks(&[1, 2]);
    assert_eq!(apply(&r, 0, &batch(vec![stored(&[1, BIG], None, &p)])), "applied");
    let grpc = pb::KvEventBatch {
        sequence_number: 1,
        events: vec![KvCacheEvent {
            event_id: 0,
            data: Some(Data::Removed(KvBlocksRemoved {
                block_hashes: vec![BIG as i64],
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    assert_eq!(r.apply_kv_events(A, &grpc.encode_to_vec()).outcome.kind(), "applied");
    assert_eq!(cached_on_a(&r, &p), 1);
    assert_eq!(
        apply(&r, 1, &batch(vec![cleared()])),
        "duplicate",
        "one cursor for both"
    );
}

#[test]
fn a_gap_holds_the_endpoint_for_replay() {
    let r = router();
    let (p, q) = (toks(&[1, 2]), toks(&[5, 6]));
    assert_eq!(apply(&r, 0, &batch(vec![stored(&[1, 2], None, &p)])), "applied");
    let lost = batch(vec![stored(&[5, 6], None, &q)]);
    let later = batch(vec![removed(&[2])]);
    // Sequence 1 was lost: 2 is refused and nothing changes (no clearing, unlike a gRPC gap).
    let res = r.apply_zmq_kv_events(A, 2, &later);
    assert_eq!(res.outcome, EventOutcome::Gap { expected: 1, got: 2 });
    assert_eq!(cached_on_a(&r, &p), 2);
    assert_eq!(apply(&r, 2, &later), "gap", "still waiting for 1");
    // The replay brings 1 and 2; the live copy of 2 is then a duplicate.
    assert_eq!(apply(&r, 1, &lost), "applied");
    assert_eq!(apply(&r, 2, &later), "applied");
    assert_eq!(apply(&r, 2, &later), "duplicate");
    assert_eq!((cached_on_a(&r, &p), cached_on_a(&r, &q)), (1, 2));
    // Without a replay the caller resets: the endpoint forgets and the next message starts afresh.
    assert_eq!(apply(&r, 9, &batch(vec![cleared()])), "gap");
    assert!(r.reset_kv_events(A));
    assert_eq!(cached_on_a(&r, &q), 0);
    assert_eq!(apply(&r, 9, &batch(vec![stored(&[5, 6], None, &q)])), "applied");
    assert_eq!(cached_on_a(&r, &q), 2);
}

#[test]
fn unknown_endpoints_are_reported() {
    let r = router();
    let res = r.apply_zmq_kv_events("10.9.9.9:1", 0, &batch(vec![cleared()]));
    assert_eq!(res.outcome, EventOutcome::UnknownEndpoint);
}
