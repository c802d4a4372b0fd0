//! `smg.grpc.common` KV-cache event messages (from `smg-grpc-proto`'s `common.proto`): what an engine's
//! `SubscribeKvEvents` stream carries. Only the fields the router reads are declared; `EngineLoad` keeps
//! its routing core (fields 1-9 and 18) and leaves the telemetry sections out.

#[derive(Clone, PartialEq, prost::Message)]
pub struct SubscribeKvEventsRequest {
    /// Resume from this sequence number (0 = start from the engine's current state).
    #[prost(uint64, tag = "1")]
    pub start_sequence_number: u64,
    /// Ask for `load_only` records before the publisher's first batch.
    #[prost(bool, tag = "2")]
    pub load_records_before_first_batch: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvEventBatch {
    #[prost(uint64, tag = "1")]
    pub sequence_number: u64,
    #[prost(double, tag = "2")]
    pub timestamp: f64,
    #[prost(message, repeated, tag = "3")]
    pub events: Vec<KvCacheEvent>,
    #[prost(int32, optional, tag = "4")]
    pub dp_rank: Option<i32>,
    #[prost(message, optional, tag = "7")]
    pub snapshot: Option<KvSnapshotChunk>,
    #[prost(message, optional, tag = "8")]
    pub load: Option<EngineLoad>,
}

/// The servicer's load record (routing core only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct EngineLoad {
    #[prost(uint32, tag = "1")]
    pub running_requests: u32,
    #[prost(uint32, tag = "2")]
    pub waiting_requests: u32,
    #[prost(uint32, optional, tag = "3")]
    pub waiting_uncached_tokens: Option<u32>,
    /// KV-cache utilization in [0, 1].
    #[prost(double, tag = "4")]
    pub token_usage: f64,
    #[prost(double, tag = "5")]
    pub gen_throughput: f64,
    #[prost(uint32, tag = "6")]
    pub max_running_requests: u32,
    #[prost(uint32, tag = "7")]
    pub age_ms: u32,
    #[prost(uint64, tag = "8")]
    pub sample: u64,
    /// The batch carries no events and repeats the last sequence number sent.
    #[prost(bool, tag = "9")]
    pub load_only: bool,
    #[prost(double, optional, tag = "18")]
    pub active_token_usage: Option<f64>,
}

/// One chunk of a relay's state snapshot; chunk 0 begins with a `KvCacheCleared`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvSnapshotChunk {
    #[prost(uint32, tag = "1")]
    pub index: u32,
    #[prost(uint32, tag = "2")]
    pub count: u32,
    #[prost(uint64, tag = "3")]
    pub blocks: u64,
    #[prost(uint64, tag = "4")]
    pub unknown_before: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvCacheEvent {
    #[prost(uint64, tag = "1")]
    pub event_id: u64,
    #[prost(oneof = "kv_cache_event::Data", tags = "2, 3, 4")]
    pub data: Option<kv_cache_event::Data>,
}

pub mod kv_cache_event {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Data {
        #[prost(message, tag = "2")]
        Stored(super::KvBlocksStored),
        #[prost(message, tag = "3")]
        Removed(super::KvBlocksRemoved),
        #[prost(message, tag = "4")]
        Cleared(super::KvCacheCleared),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum KvCacheTier {
    Unspecified = 0,
    Device = 1,
    Host = 2,
    Disk = 3,
    External = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum KvCacheLocality {
    Unspecified = 0,
    Local = 1,
    Remote = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlocksStored {
    /// A chain: each block's parent is the one before it, the first one's is `parent_block_hash`.
    #[prost(message, repeated, tag = "1")]
    pub blocks: Vec<KvBlock>,
    #[prost(int64, optional, tag = "2")]
    pub parent_block_hash: Option<i64>,
    #[prost(enumeration = "KvCacheTier", optional, tag = "3")]
    pub tier: Option<i32>,
    #[prost(uint32, optional, tag = "5")]
    pub group_idx: Option<u32>,
    #[prost(string, optional, tag = "6")]
    pub kv_cache_spec_kind: Option<String>,
    #[prost(uint32, optional, tag = "7")]
    pub kv_cache_spec_sliding_window: Option<u32>,
    #[prost(enumeration = "KvCacheLocality", optional, tag = "8")]
    pub locality: Option<i32>,
    #[prost(string, optional, tag = "11")]
    pub lora_name: Option<String>,
    #[prost(string, optional, tag = "12")]
    pub cache_salt: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlockExtraKey {
    #[prost(oneof = "kv_block_extra_key::Key", tags = "1, 2, 3, 4")]
    pub key: Option<kv_block_extra_key::Key>,
}

pub mod kv_block_extra_key {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Key {
        #[prost(string, tag = "1")]
        Text(String),
        #[prost(bytes = "vec", tag = "2")]
        Blob(Vec<u8>),
        #[prost(int64, tag = "3")]
        Number(i64),
        #[prost(message, tag = "4")]
        Multimodal(super::KvMultimodalKey),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvMultimodalKey {
    #[prost(string, tag = "1")]
    pub identifier: String,
    #[prost(int64, tag = "2")]
    pub offset: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlock {
    #[prost(int64, tag = "1")]
    pub block_hash: i64,
    #[prost(uint32, repeated, tag = "2")]
    pub token_ids: Vec<u32>,
    #[prost(int32, tag = "3")]
    pub block_size: i32,
    #[prost(int64, optional, tag = "4")]
    pub lora_id: Option<i64>,
    #[prost(int32, optional, tag = "5")]
    pub cache_level: Option<i32>,
    #[prost(message, repeated, tag = "6")]
    pub extra_keys: Vec<KvBlockExtraKey>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlocksRemoved {
    #[prost(int64, repeated, tag = "1")]
    pub block_hashes: Vec<i64>,
    #[prost(int32, optional, tag = "2")]
    pub cache_level: Option<i32>,
    #[prost(enumeration = "KvCacheTier", optional, tag = "3")]
    pub tier: Option<i32>,
    #[prost(uint32, optional, tag = "5")]
    pub group_idx: Option<u32>,
    #[prost(enumeration = "KvCacheLocality", optional, tag = "6")]
    pub locality: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KvCacheCleared {
    #[prost(string, optional, tag = "1")]
    pub ownership: Option<String>,
}

/// The gRPC method path of `SubscribeKvEvents` on a vLLM engine.
pub const SUBSCRIBE_KV_EVENTS_PATH: &str = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents";
