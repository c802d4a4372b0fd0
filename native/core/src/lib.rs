//! extproc's native core: everything per byte or per token on the gateway's data path. No Python in it:
//! `cargo test` runs without an interpreter, and any host (the `extproc._native` binding, a benchmark
//! binary, later an Envoy module) links it as a plain Rust library.

pub mod agent;
pub mod auth;
pub mod contracts;
pub mod detokenize;
pub mod engine;
pub mod error;
pub mod gateway;
pub mod grpc_frame;
pub mod health;
pub mod kv_subscription;
pub mod metrics;
pub mod model;
pub mod openai;
pub mod pb;
pub mod responses;
pub mod routing;
pub mod server;
pub mod stop;
pub mod stream;
pub mod template;
#[cfg(test)]
mod test_assets;
pub mod tokenize;
