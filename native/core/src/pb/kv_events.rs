//! `smg.grpc.common` KV-cache event messages (`protos/smg/common.proto`): what an engine's
//! `SubscribeKvEvents` stream carries.

pub use super::wire::smg::grpc::common::*;

/// The gRPC method path of `SubscribeKvEvents` on a vLLM engine.
pub const SUBSCRIBE_KV_EVENTS_PATH: &str = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents";
