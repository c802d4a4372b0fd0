//! vLLM `vllm.grpc.engine` messages (`protos/smg/vllm_engine.proto`) and the method paths the gateway
//! calls on a `VllmEngine`.

pub use super::wire::vllm::grpc::engine::*;

pub const GENERATE_PATH: &str = "/vllm.grpc.engine.VllmEngine/Generate";
pub const ABORT_PATH: &str = "/vllm.grpc.engine.VllmEngine/Abort";
