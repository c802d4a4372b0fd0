//! Hand-written prost messages for the subset of the wire contracts the data plane reads and writes.
//!
//! Field numbers are the ones of the upstream protos (Envoy `external_processor.proto`, `base.proto`,
//! `google/protobuf/struct.proto`, and vLLM's `vllm_engine.proto` from `smg-grpc-proto`). Fields the
//! gateway never touches are left out: prost skips unknown fields when decoding. `tests/test_wire.py`
//! cross-checks these definitions against the Python stubs generated from the real protos.

pub mod ext_proc;
pub mod kv_events;
pub mod structs;
pub mod vllm;
