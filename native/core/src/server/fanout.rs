//! The engine calls of a batched request, made by the server itself (see `stream/batch.rs`): every
//! prompt's non-streamed `Generate` at once, over the cached channel of its engine. Each call gets the
//! same deadline and fallbacks a single request gets: an engine that fails before answering (down,
//! busy, unreachable) is reported to the router and the next fallback is tried; one that does not
//! answer in time is aborted, reported, and the prompt fails with 504. Dropping the future (the client
//! went away, the server stops) cancels every call still running, which ends the engine's request as a
//! cancelled RPC.
//!
//! A streamed call (the Responses API's) also has a streamed chat call's deadlines: its first message
//! within `first_token_timeout` of the request going out, each next within `inter_token_timeout` of the
//! one before; an engine that stalls mid-stream is aborted and reported the same way.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

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
use crate::stream::{grpc_outcome, CallClock, CallOutcome, Deadlines, FanoutCall, Missed};

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
/// comes, within `deadlines`; fallbacks are tried while the engine failed before its first message.
/// Ok(empty) at the end.
pub async fn run_streamed(
    aborter: Arc<Aborter>,
    call: FanoutCall,
    max_message: usize,
    deadlines: Deadlines,
    sink: UnboundedSender<Bytes>,
) -> CallOutcome {
    call_on_engines(&aborter, call, max_message, Some((&sink, deadlines))).await
}

/// The call on its engine, then on each fallback while the engine before failed without answering.
async fn call_with_fallbacks(aborter: &Arc<Aborter>, call: FanoutCall, max_message: usize) -> CallOutcome {
    call_on_engines(aborter, call, max_message, None).await
}

async fn call_on_engines(
    aborter: &Arc<Aborter>,
    call: FanoutCall,
    max_message: usize,
    sink: Option<(&UnboundedSender<Bytes>, Deadlines)>,
) -> CallOutcome {
    let addresses: Vec<&str> = std::iter::once(call.endpoint.as_str())
        .chain(call.fallbacks.iter().map(String::as_str))
        .collect();
    let report = |address: &str, outcome| call.model.router.report(address, call.dp_rank, outcome);
    // A stalled engine: stop its work and keep new requests away from it.
    let stalled = |address: &str, missed: Missed| {
        aborter.abort(address, call.protocol, &call.request_id);
        report(address, Err(Failure::Down));
        Err(timeout_error(missed))
    };
    let mut last_error = ApiError::unavailable("no engine to call");
    for (attempt, address) in addresses.iter().enumerate() {
        let running = generate(aborter.channel(address), address, &call, max_message, sink);
        let result = match call.deadline {
            Some(limit) => match tokio::time::timeout(limit, running).await {
                Ok(result) => result,
                Err(_) => return stalled(address, Missed::WholeCall(limit)),
            },
            None => running.await,
        };
        let result = match result {
            Err(Failed {
                missed: Some(missed), ..
            }) => return stalled(address, missed),
            other => other,
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
                ..
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

/// A failed attempt: the error, what it says about the engine, whether messages were passed on, and the
/// deadline the engine missed when it stalled.
struct Failed {
    error: ApiError,
    outcome: Option<Result<(), Failure>>,
    passed_on: bool,
    missed: Option<Missed>,
}

impl From<(ApiError, Option<Result<(), Failure>>)> for Failed {
    fn from((error, outcome): (ApiError, Option<Result<(), Failure>>)) -> Self {
        Failed {
            error,
            outcome,
            passed_on: false,
            missed: None,
        }
    }
}

impl Failed {
    fn stalled(missed: Missed, passed_on: bool) -> Self {
        Failed {
            error: timeout_error(missed),
            outcome: Some(Err(Failure::Down)),
            passed_on,
            missed: Some(missed),
        }
    }
}

fn timeout_error(missed: Missed) -> ApiError {
    ApiError::new(504, "timeout", missed.message())
}

/// `step`'s output, unless the clock's deadline comes first (no clock, or a clock without a deadline:
/// no limit).
async fn within<T>(clock: Option<&CallClock>, step: impl Future<Output = T>) -> Result<T, Missed> {
    let Some((clock, at)) = clock.and_then(|c| Some((c, c.deadline()?))) else {
        return Ok(step.await);
    };
    tokio::time::timeout_at(tokio::time::Instant::from_std(at), step)
        .await
        .map_err(|_| clock.missed(at).expect("the deadline is missed at the deadline"))
}

/// One attempt: the engine's messages, or the error with what it says about the engine.
async fn generate(
    channel: Result<Channel, Status>,
    address: &str,
    call: &FanoutCall,
    max_message: usize,
    sink: Option<(&UnboundedSender<Bytes>, Deadlines)>,
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
    // A streamed call's clock starts as its request goes out.
    let mut clock = sink.map(|(_, deadlines)| CallClock::streamed(deadlines, Instant::now()));
    let started = client.server_streaming(tonic::Request::new(call.body.clone()), path, EngineCodec);
    let mut stream = within(clock.as_ref(), started)
        .await
        .map_err(|missed| Failed::stalled(missed, false))?
        .map_err(|s| Failed::from(grpc_error(s)))?
        .into_inner();
    let mut messages: Vec<Bytes> = Vec::new();
    let mut passed_on = false;
    loop {
        let next = within(clock.as_ref(), stream.message())
            .await
            .map_err(|missed| Failed::stalled(missed, passed_on))?;
        if let Some(clock) = clock.as_mut() {
            clock.progress(Instant::now());
        }
        let message = match next {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(status) => {
                let (error, outcome) = grpc_error(status);
                return Err(Failed {
                    error,
                    outcome,
                    passed_on,
                    missed: None,
                });
            }
        };
        match sink {
            Some((sink, _)) => {
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
