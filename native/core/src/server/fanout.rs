//! The engine calls of a batched request, made by the server itself (see `stream/batch.rs`): every
//! prompt's non-streamed `Generate` at once, over the cached channel of its engine. Each call gets the
//! same deadline and fallbacks a single request gets: an engine that fails before answering (down,
//! busy, unreachable) is reported to the router and the next fallback is tried; one that does not
//! answer in time is aborted, reported, and the prompt fails with 504. Dropping the future (the client
//! went away, the server stops) cancels every call still running, which ends the engine's request as a
//! cancelled RPC.

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::Status;

use super::abort::Aborter;
use super::engine_codec::EngineCodec;
use crate::error::ApiError;
use crate::routing::Failure;
use crate::stream::{grpc_outcome, CallOutcome, FanoutCall, Missed};

/// Every call's outcome, in call order.
pub async fn run(channels: Arc<Aborter>, calls: Vec<FanoutCall>, max_message: usize) -> Vec<CallOutcome> {
    let mut set = JoinSet::new();
    let count = calls.len();
    for (i, call) in calls.into_iter().enumerate() {
        let aborter = channels.clone();
        set.spawn(async move { (i, call_with_fallbacks(&aborter, call, max_message).await) });
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

/// One streamed call (the Responses API's `stream: true`): each engine message goes to `sink` as it
/// comes; fallbacks are tried while the engine failed before its first message. Ok(empty) at the end.
pub async fn run_streamed(
    aborter: Arc<Aborter>,
    call: FanoutCall,
    max_message: usize,
    sink: UnboundedSender<Bytes>,
) -> CallOutcome {
    call_on_engines(&aborter, call, max_message, Some(&sink)).await
}

/// The call on its engine, then on each fallback while the engine before failed without answering.
async fn call_with_fallbacks(aborter: &Arc<Aborter>, call: FanoutCall, max_message: usize) -> CallOutcome {
    call_on_engines(aborter, call, max_message, None).await
}

async fn call_on_engines(
    aborter: &Arc<Aborter>,
    call: FanoutCall,
    max_message: usize,
    sink: Option<&UnboundedSender<Bytes>>,
) -> CallOutcome {
    let addresses: Vec<&str> = std::iter::once(call.endpoint.as_str())
        .chain(call.fallbacks.iter().map(String::as_str))
        .collect();
    let report = |address: &str, outcome| call.model.router.report(address, call.dp_rank, outcome);
    let mut last_error = ApiError::unavailable("no engine to call");
    for (attempt, address) in addresses.iter().enumerate() {
        let running = generate(aborter.channel(address), address, &call, max_message, sink);
        let result = match call.deadline {
            Some(limit) => match tokio::time::timeout(limit, running).await {
                Ok(result) => result,
                Err(_) => {
                    // A stalled engine: stop its work and keep new requests away from it.
                    aborter.abort(address, call.protocol, &call.request_id);
                    report(address, Err(Failure::Down));
                    return Err(ApiError::new(504, "timeout", Missed::WholeCall(limit).message()));
                }
            },
            None => running.await,
        };
        match result {
            Ok(messages) => {
                report(address, Ok(()));
                return Ok(messages);
            }
            Err(Failed {
                error,
                outcome,
                passed_on,
            }) => {
                if let Some(outcome) = outcome {
                    report(address, outcome);
                }
                // A streamed call that already passed messages on cannot start over elsewhere.
                let retryable = matches!(outcome, Some(Err(_))) && !passed_on;
                last_error = error;
                if !retryable || attempt + 1 == addresses.len() {
                    break;
                }
            }
        }
    }
    Err(last_error)
}

/// A failed attempt: the error, what it says about the engine, and whether messages were passed on.
struct Failed {
    error: ApiError,
    outcome: Option<Result<(), Failure>>,
    passed_on: bool,
}

impl From<(ApiError, Option<Result<(), Failure>>)> for Failed {
    fn from((error, outcome): (ApiError, Option<Result<(), Failure>>)) -> Self {
        Failed {
            error,
            outcome,
            passed_on: false,
        }
    }
}

/// One attempt: the engine's messages, or the error with what it says about the engine.
async fn generate(
    channel: Result<Channel, Status>,
    address: &str,
    call: &FanoutCall,
    max_message: usize,
    sink: Option<&UnboundedSender<Bytes>>,
) -> Result<Vec<Bytes>, Failed> {
    let grpc_error = |s: Status| {
        let code = s.code() as u32;
        (ApiError::from_grpc(code, s.message()), grpc_outcome(code))
    };
    let channel = channel.map_err(|s| Failed::from(grpc_error(s)))?;
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(max_message);
    client.ready().await.map_err(|e| {
        let error = ApiError::unavailable(format!("engine {address} not reachable: {e}"));
        Failed::from((error, Some(Err(Failure::Down))))
    })?;
    let path = PathAndQuery::from_static(call.path);
    let mut stream = client
        .server_streaming(tonic::Request::new(call.body.clone()), path, EngineCodec)
        .await
        .map_err(|s| Failed::from(grpc_error(s)))?
        .into_inner();
    let mut messages: Vec<Bytes> = Vec::new();
    let mut passed_on = false;
    loop {
        let message = match stream.message().await {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(status) => {
                let (error, outcome) = grpc_error(status);
                return Err(Failed {
                    error,
                    outcome,
                    passed_on,
                });
            }
        };
        match sink {
            Some(sink) => {
                passed_on = true;
                // The receiver gone means the request is over: stop reading.
                if sink.send(message).is_err() {
                    break;
                }
            }
            None => messages.push(message),
        }
    }
    Ok(messages)
}
