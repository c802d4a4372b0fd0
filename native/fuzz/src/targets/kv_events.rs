//! The KV-event decoders and the event state behind them: a sequence of batches, each a protobuf
//! `KvEventBatch` (the gRPC `SubscribeKvEvents` stream, `routing/events.rs`) or a vLLM ZMQ msgpack payload
//! (`routing/zmq_events.rs`), applied in order to one router's engine, with resets and picks between.
//! Records (see `records`): kind bit 0 chooses ZMQ, bit 1 resets the engine's events first, bit 2 picks
//! after; a ZMQ record's sequence number is the count of ZMQ records before it plus its payload's gap
//! byte (the record kind's high nibble).

use extproc_core::pb::kv_events::{
    kv_block_extra_key::Key, kv_cache_event::Data, EngineLoad, KvBlock, KvBlockExtraKey, KvBlocksRemoved,
    KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch, KvSnapshotChunk,
};
use extproc_core::routing::{Router, RouterConfig};
use prost::Message;
use rmpv::Value;

use super::{records, signature, Target};
use crate::rng::Rng;

pub const TARGET: Target = Target {
    name: "kv_events",
    run,
    generate,
    mutate,
    dictionary,
};

const ENGINE: &str = "10.0.0.1:50051";
const OTHER: &str = "10.0.0.2:50051";
const BLOCK: usize = 4;
/// Hashes drawn from a small pool so removals and parents name stored blocks.
const HASHES: [i64; 6] = [1, 2, 3, -4, i64::MIN, i64::MAX];

fn router() -> Router {
    let router = Router::new(
        "kv_events",
        RouterConfig {
            seed: Some(7),
            ..Default::default()
        },
    )
    .expect("the kv_events policy");
    router
        .set_endpoints(vec![
            (ENGINE.to_string(), BLOCK as u32),
            (OTHER.to_string(), BLOCK as u32),
        ])
        .expect("endpoints");
    router
}

fn run(data: &[u8]) -> u64 {
    let (_, records) = records::read(data);
    let router = router();
    let probe: Vec<u32> = (1..=4).flat_map(|t| [t; BLOCK]).collect();
    let mut zmq_sequence = 0u64;
    let mut outcomes = std::collections::BTreeSet::new();
    for record in records {
        if record.kind & 2 != 0 {
            assert!(router.reset_kv_events(ENGINE));
        }
        let result = if record.kind & 1 == 0 {
            router.apply_kv_events(ENGINE, record.payload)
        } else {
            let sequence = zmq_sequence + u64::from(record.kind >> 4);
            zmq_sequence += 1;
            router.apply_zmq_kv_events(ENGINE, sequence, record.payload)
        };
        outcomes.insert(result.outcome.kind());
        if record.kind & 4 != 0 {
            let pick = router.pick(&probe, None).expect("two endpoints");
            let cached = pick.cached_tokens() as usize;
            assert!(cached <= probe.len(), "{cached} cached tokens of {}", probe.len());
        }
    }
    let stats = router.index_stats();
    signature(&format!("{outcomes:?}{}", stats.event_blocks.min(1)))
}

fn tokens(rng: &mut Rng, blocks: usize) -> Vec<u32> {
    let mut out: Vec<u32> = (0..blocks).flat_map(|_| [1 + rng.below(4) as u32; BLOCK]).collect();
    if rng.one_in(8) {
        out.truncate(rng.below(out.len() + 1));
    }
    out
}

fn proto_event(rng: &mut Rng) -> KvCacheEvent {
    let data = match rng.below(5) {
        0 => Data::Cleared(KvCacheCleared::default()),
        1 => Data::Removed(KvBlocksRemoved {
            block_hashes: (0..rng.size(4)).map(|_| *rng.pick(&HASHES)).collect(),
            tier: rng.one_in(4).then(|| rng.below(4) as i32),
            ..Default::default()
        }),
        _ => Data::Stored(KvBlocksStored {
            blocks: (0..rng.size(4))
                .map(|_| KvBlock {
                    block_hash: *rng.pick(&HASHES),
                    token_ids: tokens(rng, 1),
                    block_size: if rng.one_in(8) {
                        rng.below(9) as i32 - 1
                    } else {
                        BLOCK as i32
                    },
                    lora_id: rng.one_in(8).then(|| rng.below(3) as i64),
                    extra_keys: if rng.one_in(6) {
                        vec![KvBlockExtraKey {
                            key: Some(Key::Text("salt".into())),
                        }]
                    } else {
                        Vec::new()
                    },
                    ..Default::default()
                })
                .collect(),
            parent_block_hash: rng.one_in(2).then(|| *rng.pick(&HASHES)),
            tier: rng.one_in(4).then(|| rng.below(4) as i32),
            group_idx: rng.one_in(6).then(|| rng.below(3) as u32),
            ..Default::default()
        }),
    };
    KvCacheEvent {
        event_id: rng.below(100) as u64,
        data: Some(data),
    }
}

fn proto_batch(rng: &mut Rng, sequence: u64) -> Vec<u8> {
    KvEventBatch {
        sequence_number: if rng.one_in(8) { rng.below(5) as u64 } else { sequence },
        timestamp: 1.7e9,
        events: (0..rng.size(5)).map(|_| proto_event(rng)).collect(),
        dp_rank: rng.one_in(8).then(|| rng.below(3) as i32 - 1),
        snapshot: rng.one_in(8).then(|| KvSnapshotChunk {
            index: rng.below(3) as u32,
            count: rng.below(3) as u32,
            blocks: rng.below(10) as u64,
            unknown_before: rng.below(3) as u64,
        }),
        load: rng.one_in(4).then(|| EngineLoad {
            running_requests: rng.below(10) as u32,
            token_usage: rng.below(3) as f64 / 2.0,
            load_only: rng.one_in(3),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn text(s: &str) -> Value {
    Value::from(s)
}

fn zmq_hash(rng: &mut Rng) -> Value {
    let h = *rng.pick(&HASHES);
    match rng.below(4) {
        0 => Value::Binary((h as u64).to_be_bytes().repeat(4)),
        1 => Value::from(h),
        _ => Value::from(h as u64),
    }
}

fn zmq_event(rng: &mut Rng) -> Value {
    let (kind, fields): (&str, Vec<(&str, Value)>) = match rng.below(5) {
        0 => ("AllBlocksCleared", Vec::new()),
        1 => (
            "BlockRemoved",
            vec![
                (
                    "block_hashes",
                    Value::Array((0..rng.size(4)).map(|_| zmq_hash(rng)).collect()),
                ),
                ("medium", text(if rng.one_in(4) { "CPU" } else { "GPU" })),
            ],
        ),
        _ => {
            let blocks = rng.size(4);
            (
                "BlockStored",
                vec![
                    (
                        "block_hashes",
                        Value::Array((0..blocks).map(|_| zmq_hash(rng)).collect()),
                    ),
                    (
                        "parent_block_hash",
                        if rng.one_in(2) { Value::Nil } else { zmq_hash(rng) },
                    ),
                    (
                        "token_ids",
                        Value::Array(tokens(rng, blocks).into_iter().map(Value::from).collect()),
                    ),
                    (
                        "block_size",
                        Value::from(if rng.one_in(8) { rng.below(9) } else { BLOCK } as u64),
                    ),
                    ("lora_id", Value::Nil),
                    ("medium", text("GPU")),
                    ("extra_keys", Value::Array(vec![Value::Nil; blocks])),
                ],
            )
        }
    };
    if rng.one_in(3) {
        // The older array form: the tag, then the fields in order.
        let mut items = vec![text(kind)];
        items.extend(fields.into_iter().map(|(_, v)| v));
        Value::Array(items)
    } else {
        let mut map = vec![(text("type"), text(kind))];
        map.extend(fields.into_iter().map(|(k, v)| (text(k), v)));
        Value::Map(map)
    }
}

fn zmq_batch(rng: &mut Rng) -> Vec<u8> {
    let batch = Value::Array(vec![
        Value::F64(1.7e9),
        Value::Array((0..rng.size(5)).map(|_| zmq_event(rng)).collect()),
        if rng.one_in(4) { Value::Nil } else { Value::from(0) },
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("msgpack to a Vec");
    out
}

fn record(rng: &mut Rng, sequence: u64) -> (u8, Vec<u8>) {
    let zmq = rng.one_in(2);
    let mut kind = zmq as u8;
    if rng.one_in(10) {
        kind |= 2;
    }
    if rng.one_in(3) {
        kind |= 4;
    }
    if zmq && rng.one_in(10) {
        kind |= (rng.below(3) as u8) << 4;
    }
    let payload = if zmq {
        zmq_batch(rng)
    } else {
        proto_batch(rng, sequence)
    };
    (kind, payload)
}

fn generate(rng: &mut Rng) -> Vec<u8> {
    let records: Vec<(u8, Vec<u8>)> = (0..1 + rng.size(8)).map(|i| record(rng, i as u64)).collect();
    records::write(0, &records)
}

fn mutate(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    if rng.one_in(2) {
        return records::mutate(rng, data, 8);
    }
    let (header, existing) = records::read(data);
    let mut owned: Vec<(u8, Vec<u8>)> = existing.iter().map(|r| (r.kind, r.payload.to_vec())).collect();
    let at = rng.below(owned.len() + 1);
    let fresh = record(rng, at as u64);
    owned.insert(at, fresh);
    Some(records::write(header, &owned))
}

fn dictionary() -> Vec<&'static [u8]> {
    vec![
        b"\xabBlockStored",
        b"\xacBlockRemoved",
        b"\xb0AllBlocksCleared",
        b"\xa4type",
        b"\xc0",
        b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\xdc\xff\xff",
        b"\xdf\xff\xff\xff\xff",
    ]
}
