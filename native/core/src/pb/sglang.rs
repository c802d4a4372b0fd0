//! SGLang `sglang.grpc.scheduler` messages (`protos/smg/sglang_scheduler.proto`) and the method paths
//! the gateway calls on a `SglangScheduler`.

pub use super::wire::sglang::grpc::scheduler::*;

pub const GENERATE_PATH: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
pub const ABORT_PATH: &str = "/sglang.grpc.scheduler.SglangScheduler/Abort";
