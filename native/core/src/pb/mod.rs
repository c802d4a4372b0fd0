//! Hand-written prost messages for the subset of the wire contracts the data plane reads and writes.
//!
//! Field numbers are the ones of the upstream protos (Envoy `external_processor.proto`, `base.proto`,
//! `google/protobuf/struct.proto`, and `vllm_engine.proto` and `sglang_scheduler.proto` from
//! `smg-grpc-proto`). Fields the gateway never touches are left out: prost skips unknown fields when
//! decoding. The integration tests check them against the real stubs end to end.

pub mod ext_proc;
pub mod kv_events;
pub mod logprobs;
pub mod sglang;
pub mod structs;
pub mod vllm;
