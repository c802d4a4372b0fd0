//! The engine calls of a batched request, made by the server itself (see `stream/batch.rs`): every
//! prompt's non-streamed `Generate` at once, over the cached channel of its engine. Dropping the future
//! (the client went away, the server stops) cancels every call still running, which ends the engine's
//! request as a cancelled RPC.

use bytes::Bytes;
use http::uri::PathAndQuery;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::Status;

use super::abort::Aborter;
use super::engine_codec::EngineCodec;
use crate::error::ApiError;
use crate::stream::{CallOutcome, FanoutCall};

/// Every call's outcome, in call order.
pub async fn run(channels: std::sync::Arc<Aborter>, calls: Vec<FanoutCall>, max_message: usize) -> Vec<CallOutcome> {
    let mut set = JoinSet::new();
    let count = calls.len();
    for (i, call) in calls.into_iter().enumerate() {
        let channel = channels.channel(&call.endpoint);
        set.spawn(async move { (i, generate(channel, call, max_message).await) });
    }
    let mut outcomes: Vec<Option<CallOutcome>> = (0..count).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, outcome)) = joined {
            outcomes[i] = Some(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Err(ApiError::internal("a batched engine call did not finish"))))
        .collect()
}

async fn generate(channel: Result<Channel, Status>, call: FanoutCall, max_message: usize) -> CallOutcome {
    let grpc_error = |s: Status| ApiError::from_grpc(s.code() as u32, s.message());
    let mut client = tonic::client::Grpc::new(channel.map_err(grpc_error)?).max_decoding_message_size(max_message);
    client
        .ready()
        .await
        .map_err(|e| ApiError::unavailable(format!("engine {} not reachable: {e}", call.endpoint)))?;
    let path = PathAndQuery::from_static(call.path);
    let mut stream = client
        .server_streaming(tonic::Request::new(call.body), path, EngineCodec)
        .await
        .map_err(grpc_error)?
        .into_inner();
    let mut messages: Vec<Bytes> = Vec::new();
    while let Some(message) = stream.message().await.map_err(grpc_error)? {
        messages.push(message);
    }
    Ok(messages)
}
