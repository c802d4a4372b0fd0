//! gRPC's health checking protocol `grpc.health.v1` (`protos/grpc/health/v1/health.proto`): the messages
//! and tonic's server side of `Health`, which the native ext_proc server answers (`server/health.rs`).

pub use super::wire::grpc::health::v1::*;
