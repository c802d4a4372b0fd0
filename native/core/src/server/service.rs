//! The one gRPC method served, `ExternalProcessor/Process`: every ext_proc message goes through the
//! request's `RequestStream` and its replies go straight back, on the runtime that polls the stream.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_core::Stream;
use prost::Message;
use tokio::sync::watch;
use tonic::body::Body;
use tonic::server::Grpc;
use tonic::{Status, Streaming};
use tower_service::Service;

use super::abort::Aborter;
use super::codec::RawCodec;
use super::fanout;
use super::stats::{Counters, Finished, Telemetry};
use crate::gateway::Gateway;
use crate::pb::ext_proc::{ProcessingRequest, ProcessingResponse};
use crate::stream::{CallOutcome, RequestStream};

pub const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
/// Request bodies travel inside ext_proc messages; the gateway's own body limit applies after this.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What every stream needs: the gateway, where aborts and summaries go, and the stop signal.
pub struct Shared {
    pub gateway: Arc<Gateway>,
    pub telemetry: Arc<Telemetry>,
    pub aborter: Arc<Aborter>,
    /// Turns true when the grace period of a stop ran out: open streams end at once.
    pub cancel: watch::Receiver<bool>,
}

#[derive(Clone)]
pub struct ExtProcService {
    shared: Arc<Shared>,
}

impl ExtProcService {
    pub fn new(shared: Arc<Shared>) -> Self {
        ExtProcService { shared }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<Body>> for ExtProcService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != PROCESS_PATH {
            let status = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(ready(Ok(status.into_http())));
        }
        let process = Process {
            shared: self.shared.clone(),
        };
        Box::pin(async move {
            let mut grpc = Grpc::new(RawCodec)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            Ok(grpc.streaming(process, request).await)
        })
    }
}

/// The handler tonic calls with the decoded request stream.
struct Process {
    shared: Arc<Shared>,
}

impl Service<tonic::Request<Streaming<Bytes>>> for Process {
    type Response = tonic::Response<ProcessStream>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        ready(Ok(tonic::Response::new(ProcessStream::new(
            self.shared.clone(),
            request.into_inner(),
        ))))
    }
}

/// One HTTP request's ext_proc stream: pulls Envoy's messages, yields the state machine's replies.
/// It ends when Envoy half-closes or resets the stream; dropping it (at the end, or when hyper gives
/// up on a reset stream) aborts the engine call if one is still running and records the summary.
pub struct ProcessStream {
    shared: Arc<Shared>,
    inbound: Streaming<Bytes>,
    machine: RequestStream,
    replies: std::vec::IntoIter<Vec<u8>>,
    /// A batched request's engine calls, while they run.
    fanout: Option<BoxFuture<Vec<CallOutcome>>>,
    cancelled: BoxFuture<()>,
    ended: bool,
    started: Instant,
}

impl ProcessStream {
    fn new(shared: Arc<Shared>, inbound: Streaming<Bytes>) -> Self {
        Counters::bump(&shared.telemetry.counters.streams_started);
        let mut cancel = shared.cancel.clone();
        ProcessStream {
            machine: RequestStream::new(shared.gateway.clone()),
            cancelled: Box::pin(async move {
                // An error means the server is gone: cancelled too.
                let _ = cancel.wait_for(|&c| c).await;
            }),
            shared,
            inbound,
            replies: Vec::new().into_iter(),
            fanout: None,
            ended: false,
            started: Instant::now(),
        }
    }
}

impl Stream for ProcessStream {
    type Item = Result<Vec<u8>, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(reply) = this.replies.next() {
                return Poll::Ready(Some(Ok(reply)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if this.cancelled.as_mut().poll(cx).is_ready() {
                this.ended = true;
                return Poll::Ready(Some(Err(Status::unavailable("extproc is shutting down"))));
            }
            if let Some(fanout) = this.fanout.as_mut() {
                let outcomes = ready!(fanout.as_mut().poll(cx));
                this.fanout = None;
                this.replies = encoded(this.machine.fanout_done(outcomes));
                continue;
            }
            match ready!(Pin::new(&mut this.inbound).poll_next(cx)) {
                Some(Ok(message)) => {
                    let Ok(request) = ProcessingRequest::decode(message) else {
                        this.ended = true;
                        return Poll::Ready(Some(Err(Status::internal("undecodable ext_proc message"))));
                    };
                    this.replies = encoded(this.machine.process(request));
                    if let Some(calls) = this.machine.take_fanout() {
                        let limit = this.shared.gateway.limits.max_engine_message;
                        this.fanout = Some(Box::pin(fanout::run(this.shared.aborter.clone(), calls, limit)));
                    }
                }
                // Envoy closed its side (the exchange is over) or reset the stream (client gone).
                Some(Err(_)) | None => this.ended = true,
            }
        }
    }
}

fn encoded(replies: Vec<ProcessingResponse>) -> std::vec::IntoIter<Vec<u8>> {
    replies
        .iter()
        .map(Message::encode_to_vec)
        .collect::<Vec<_>>()
        .into_iter()
}

impl Drop for ProcessStream {
    fn drop(&mut self) {
        let pending = self.machine.pending_abort();
        if let Some(p) = pending {
            self.shared.aborter.abort(p.endpoint, p.protocol, p.request_id);
        }
        self.shared.telemetry.record(|| Finished {
            summary: self.machine.summary(),
            aborted: pending.is_some(),
            duration: self.started.elapsed(),
        });
    }
}
