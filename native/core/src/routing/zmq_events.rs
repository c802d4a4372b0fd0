//! vLLM's ZMQ KV-event payloads (`--kv-events-config`, `ZmqEventPublisher`) as the `KvEventBatch` the gRPC
//! path applies, so both channels share one event state (engine-hash map, cursor, filters) per endpoint.
//!
//! A ZMQ message is `(topic, sequence as 8 bytes big-endian, payload)`; the caller passes the sequence.
//! The payload is vLLM's `KVEventBatch` msgspec struct in msgpack, an array `[ts, events, dp_rank]`. Each
//! event is a tagged struct: a map with a `"type"` key (vLLM 0.32) or a tag-first array (older releases,
//! fields in declaration order); fields equal to their default may be absent in both.
//!
//! Block hashes are u64 integers (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, the default) or sha256 bytes;
//! both become the signed 64-bit number SubscribeKvEvents carries for them (the low 64 bits read
//! big-endian), so a Removed names the same engine hash as the Stored before it whichever form was sent.

use rmpv::Value;

use crate::pb::kv_events::{
    self as pb, kv_block_extra_key::Key, kv_cache_event::Data, KvBlock, KvBlockExtraKey, KvBlocksRemoved,
    KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch, KvMultimodalKey,
};

/// Field order of the array form (vLLM's struct declarations).
const STORED_FIELDS: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
];
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium", "group_idx", "locality", "ownership"];
const CLEARED_FIELDS: &[&str] = &["ownership"];

/// Nesting a batch never needs beyond: batch → events → event → extra keys → key → pair.
const MAX_DEPTH: usize = 16;

/// Decodes one ZMQ payload numbered `sequence`. Events of unknown types are left out (a newer vLLM);
/// anything else that is not vLLM's layout is an error (the caller reports the batch malformed).
pub fn decode(sequence: u64, payload: &[u8]) -> Result<KvEventBatch, String> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH).map_err(|e| format!("msgpack: {e}"))?;
    if !rd.is_empty() {
        return Err(format!("{} bytes after the batch", rd.len()));
    }
    let Value::Array(top) = value else {
        return Err("a batch is an array [ts, events, dp_rank]".into());
    };
    let (timestamp, events) = match top.as_slice() {
        [ts, Value::Array(events), ..] => (ts.as_f64().unwrap_or(0.0), events),
        _ => return Err("a batch is an array [ts, events, dp_rank]".into()),
    };
    let dp_rank = top.get(2).and_then(Value::as_i64).and_then(|r| i32::try_from(r).ok());
    let mut out = Vec::with_capacity(events.len());
    for (i, event) in events.iter().enumerate() {
        let data = decode_event(event).map_err(|e| format!("event {i}: {e}"))?;
        if let Some(data) = data {
            out.push(KvCacheEvent {
                event_id: i as u64,
                data: Some(data),
            });
        }
    }
    Ok(KvEventBatch {
        sequence_number: sequence,
        timestamp,
        events: out,
        dp_rank,
        snapshot: None,
        load: None,
    })
}

/// An event's fields by name; nil values count as absent.
struct Fields<'a>(Vec<(&'a str, &'a Value)>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    fn str(&self, name: &str) -> Option<&'a str> {
        self.get(name).and_then(Value::as_str)
    }

    fn u32(&self, name: &str) -> Option<u32> {
        self.get(name)
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    }
}

fn decode_event(event: &Value) -> Result<Option<Data>, String> {
    let (kind, fields) = match event {
        Value::Map(pairs) => {
            let kind = pairs
                .iter()
                .find(|(k, _)| k.as_str() == Some("type"))
                .and_then(|(_, v)| v.as_str())
                .ok_or("no \"type\"")?;
            let fields = pairs
                .iter()
                .filter(|(_, v)| !v.is_nil())
                .filter_map(|(k, v)| Some((k.as_str()?, v)))
                .collect();
            (kind, Fields(fields))
        }
        Value::Array(items) => {
            let kind = items.first().and_then(Value::as_str).ok_or("no type tag")?;
            let names = match kind {
                "BlockStored" => STORED_FIELDS,
                "BlockRemoved" => REMOVED_FIELDS,
                "AllBlocksCleared" => CLEARED_FIELDS,
                _ => &[],
            };
            let fields = names
                .iter()
                .zip(&items[1..])
                .filter(|(_, v)| !v.is_nil())
                .map(|(&n, v)| (n, v))
                .collect();
            (kind, Fields(fields))
        }
        _ => return Err("an event is a map or an array".into()),
    };
    Ok(match kind {
        "BlockStored" => Some(Data::Stored(stored(&fields)?)),
        "BlockRemoved" => Some(Data::Removed(KvBlocksRemoved {
            block_hashes: hashes(fields.get("block_hashes"))?,
            cache_level: None,
            tier: tier(fields.str("medium")),
            group_idx: fields.u32("group_idx"),
            locality: locality(fields.str("locality")),
        })),
        "AllBlocksCleared" => Some(Data::Cleared(KvCacheCleared {
            ownership: fields.str("ownership").map(str::to_string),
        })),
        _ => None,
    })
}

fn stored(f: &Fields<'_>) -> Result<KvBlocksStored, String> {
    let block_hashes = hashes(f.get("block_hashes"))?;
    let Some(Value::Array(tokens)) = f.get("token_ids") else {
        return Err("token_ids is not an array".into());
    };
    let block_size = f
        .get("block_size")
        .and_then(Value::as_u64)
        .ok_or("block_size is not an integer")?;
    let parent_block_hash = f.get("parent_block_hash").map(hash).transpose()?;
    let lora_name = f.str("lora_name").map(str::to_string);
    let per_block_keys = match f.get("extra_keys") {
        Some(Value::Array(keys)) => keys.as_slice(),
        _ => &[],
    };
    // vLLM puts the cache salt among the first block's extra keys, after the LoRA name.
    let cache_salt = per_block_keys
        .first()
        .and_then(Value::as_array)
        .and_then(|keys| {
            keys.iter()
                .filter_map(Value::as_str)
                .find(|&t| !t.is_empty() && Some(t) != lora_name.as_deref())
        })
        .map(str::to_string);
    let width = usize::try_from(block_size).unwrap_or(0);
    // Blocks whose tokens cannot be told apart go in without token ids: the event state skips them.
    let aligned = width > 0 && tokens.len() == width * block_hashes.len();
    let mut blocks = Vec::with_capacity(block_hashes.len());
    for (i, &block_hash) in block_hashes.iter().enumerate() {
        let token_ids = if aligned {
            token_ids(&tokens[i * width..(i + 1) * width])?
        } else {
            Vec::new()
        };
        let extra_keys = per_block_keys
            .get(i)
            .and_then(Value::as_array)
            .map(|keys| keys.iter().filter_map(extra_key).collect())
            .unwrap_or_default();
        blocks.push(KvBlock {
            block_hash,
            token_ids,
            block_size: i32::try_from(block_size).unwrap_or(0),
            lora_id: f.get("lora_id").and_then(Value::as_i64),
            cache_level: None,
            extra_keys,
        });
    }
    Ok(KvBlocksStored {
        blocks,
        parent_block_hash,
        tier: tier(f.str("medium")),
        group_idx: f.u32("group_idx"),
        kv_cache_spec_kind: f.str("kv_cache_spec_kind").map(str::to_string),
        kv_cache_spec_sliding_window: f.u32("kv_cache_spec_sliding_window"),
        locality: locality(f.str("locality")),
        lora_name,
        cache_salt,
    })
}

/// An engine block hash as SubscribeKvEvents carries it: an integer's low 64 bits, or the last 8 bytes of
/// a byte string read big-endian (`int.from_bytes(h, "big") & (2**64 - 1)`), as a signed number.
fn hash(v: &Value) -> Result<i64, String> {
    match v {
        Value::Integer(n) => n
            .as_u64()
            .map(|u| u as i64)
            .or_else(|| n.as_i64())
            .ok_or_else(|| "block hash out of range".into()),
        Value::Binary(b) => {
            let tail = &b[b.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte)) as i64)
        }
        _ => Err("a block hash is an integer or bytes".into()),
    }
}

fn hashes(v: Option<&Value>) -> Result<Vec<i64>, String> {
    match v {
        Some(Value::Array(items)) => items.iter().map(hash).collect(),
        _ => Err("block_hashes is not an array".into()),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, String> {
    items
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or("a token id is not a u32")
        })
        .collect::<Result<_, _>>()
        .map_err(str::to_string)
}

/// One of vLLM's untagged per-block extra keys, as the relay types them; shapes it does not model are
/// left out.
fn extra_key(v: &Value) -> Option<KvBlockExtraKey> {
    let key = match v {
        Value::String(s) => Key::Text(s.as_str()?.to_string()),
        Value::Binary(b) => Key::Blob(b.clone()),
        Value::Integer(n) => Key::Number(n.as_i64()?),
        Value::Array(pair) => match pair.as_slice() {
            [Value::String(id), Value::Integer(offset)] => Key::Multimodal(KvMultimodalKey {
                identifier: id.as_str()?.to_string(),
                offset: offset.as_i64()?,
            }),
            _ => return None,
        },
        _ => return None,
    };
    Some(KvBlockExtraKey { key: Some(key) })
}

/// vLLM's `medium` as a tier: absent means the device; an unknown medium is kept out of the index.
fn tier(medium: Option<&str>) -> Option<i32> {
    let medium = medium?.to_ascii_uppercase();
    let tier = match medium.as_str() {
        "GPU" | "DEVICE" => pb::KvCacheTier::Device,
        "CPU" | "CPU_PINNED" | "CPU_TIER1" => pb::KvCacheTier::Host,
        "CPU_TIER2" | "DISK" | "NVME" | "STORAGE" => pb::KvCacheTier::Disk,
        _ => pb::KvCacheTier::External,
    };
    Some(tier as i32)
}

/// `LOCAL` or `REMOTE` relative to the publisher; anything else is not known to be local.
fn locality(locality: Option<&str>) -> Option<i32> {
    let local = locality?.eq_ignore_ascii_case("LOCAL");
    let l = if local {
        pb::KvCacheLocality::Local
    } else {
        pb::KvCacheLocality::Remote
    };
    Some(l as i32)
}

#[cfg(test)]
#[path = "zmq_events_tests.rs"]
mod tests;
