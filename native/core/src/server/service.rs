//! The one gRPC method served, `ExternalProcessor/Process`, through the server trait tonic generates
//! from `protos/`: every ext_proc message goes through the request's `RequestStream` and its replies
//! go straight back, on the runtime that polls the stream, except the message completing a large
//! request body, which is processed on the worker pool (`workers`) while the runtime serves the rest.
//! Any other method is tonic's UNIMPLEMENTED.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use futures_core::Stream;
use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::sync::watch;
use tokio::time::Sleep;
use tonic::{Request, Response, Status, Streaming};

use super::abort::Aborter;
use super::fanout;
use super::stats::{Counters, Finished, Telemetry};
use super::workers::Workers;
use crate::contracts;
use crate::engine::Protocol;
use crate::gateway::Gateway;
use crate::pb::ext_proc::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use crate::pb::ext_proc::{ProcessingRequest, ProcessingResponse};
use crate::responses::api::{self as responses_api, Answer, Piece};
use crate::responses::store::{ResponseStore, StoreBackend, TenantStore};
use crate::stream::{CallOutcome, RequestStream};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Request bodies travel inside ext_proc messages; the gateway's own body limit applies after this.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What every stream needs: the gateway, where aborts and summaries go, and the stop signal.
pub struct Shared {
    pub gateway: Arc<Gateway>,
    pub telemetry: Arc<Telemetry>,
    pub aborter: Arc<Aborter>,
    /// Turns true when the grace period of a stop ran out: open streams end at once.
    pub cancel: watch::Receiver<bool>,
    /// Where large request bodies are parsed, templated and tokenized.
    pub workers: Workers,
    /// The Responses API's storage of every tenant (None: `responses_store = none`).
    pub responses_store: Option<Arc<dyn StoreBackend>>,
}

/// The state machine back from the worker pool with its replies; `None` if the work panicked.
type Work = BoxFuture<Option<(RequestStream, Vec<ProcessingResponse>)>>;

/// The `ExternalProcessor` service: one `ProcessStream` per call of its one method.
pub struct ExtProcessor {
    shared: Arc<Shared>,
}

/// The service as tonic serves it, with the message size limits set.
pub fn server(shared: Arc<Shared>) -> ExternalProcessorServer<ExtProcessor> {
    ExternalProcessorServer::new(ExtProcessor { shared })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

#[tonic::async_trait]
impl ExternalProcessor for ExtProcessor {
    type ProcessStream = ProcessStream;

    async fn process(&self, request: Request<Streaming<ProcessingRequest>>) -> Result<Response<ProcessStream>, Status> {
        // The Envoy in front says whether its response module answers the client (one config or the other,
        // whatever this server's own settings say).
        let in_envoy = request
            .metadata()
            .get(contracts::RESPONSE_PATH_METADATA)
            .is_some_and(|v| v.as_bytes() == contracts::RESPONSE_PATH_MODULE.as_bytes());
        let mut stream = ProcessStream::new(self.shared.clone(), request.into_inner());
        if in_envoy {
            stream.machine.answered_in_envoy();
        }
        Ok(Response::new(stream))
    }
}

/// One HTTP request's ext_proc stream: pulls Envoy's messages, yields the state machine's replies.
/// It ends when Envoy half-closes or resets the stream; dropping it (at the end, or when hyper gives
/// up on a reset stream) aborts the engine call if one is still running and records the summary.
pub struct ProcessStream {
    shared: Arc<Shared>,
    inbound: Streaming<ProcessingRequest>,
    machine: RequestStream,
    replies: std::vec::IntoIter<ProcessingResponse>,
    /// A batched request's engine calls, while they run.
    fanout: Option<BoxFuture<Vec<CallOutcome>>>,
    /// A Responses API request, while the server serves it (`responses::api`), and the parts of its
    /// streamed answer as they come.
    job: Option<BoxFuture<Answer>>,
    job_pieces: Option<UnboundedReceiver<Piece>>,
    /// The state machine, away on the worker pool (`machine` holds a stand-in meanwhile).
    working: Option<Work>,
    cancelled: BoxFuture<()>,
    ended: bool,
    /// The engine call a stop or a missed deadline cut (endpoint, protocol, engine request id): the
    /// machine has ended the exchange by then, so Drop aborts this one.
    cut_abort: Option<(String, Protocol, String)>,
    /// A cut with nothing to tell the client ends the ext_proc stream with UNAVAILABLE (Envoy's 503).
    unavailable_owed: bool,
    started: Instant,
    /// Fires at (or after) the engine call's deadline (`RequestStream::deadline`); moved only when the
    /// deadline comes sooner, so a token costs no timer update.
    timer: Option<Pin<Box<Sleep>>>,
}

impl ProcessStream {
    fn new(shared: Arc<Shared>, inbound: Streaming<ProcessingRequest>) -> Self {
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
            job: None,
            job_pieces: None,
            working: None,
            ended: false,
            cut_abort: None,
            unavailable_owed: false,
            started: Instant::now(),
            timer: None,
        }
    }
}

impl Stream for ProcessStream {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(reply) = this.replies.next() {
                return Poll::Ready(Some(Ok(reply)));
            }
            if this.ended {
                if std::mem::take(&mut this.unavailable_owed) {
                    return Poll::Ready(Some(Err(Status::unavailable("extproc is shutting down"))));
                }
                return Poll::Ready(None);
            }
            if this.cancelled.as_mut().poll(cx).is_ready() {
                // The grace ran out: the client hears why (an SSE error event and [DONE], or a 503) and
                // its response ends cleanly; Envoy then resets the engine call, and Drop aborts it.
                this.ended = true;
                this.keep_cut_abort();
                this.replies = this.machine.shutdown().into_iter();
                this.unavailable_owed = this.replies.len() == 0;
                continue;
            }
            if this.deadline_passed(cx) {
                let now = Instant::now();
                this.keep_cut_abort();
                this.replies = this.machine.time_out(now).into_iter();
                continue;
            }
            if let Some(work) = this.working.as_mut() {
                let done = ready!(work.as_mut().poll(cx));
                this.working = None;
                let Some((machine, replies)) = done else {
                    this.ended = true;
                    return Poll::Ready(Some(Err(Status::internal("processing the request failed"))));
                };
                this.machine = machine;
                this.replies = replies.into_iter();
                this.start_fanout();
                continue;
            }
            if let Some(fanout) = this.fanout.as_mut() {
                let outcomes = ready!(fanout.as_mut().poll(cx));
                this.fanout = None;
                this.replies = this.machine.fanout_done(outcomes).into_iter();
                continue;
            }
            if let Some(job) = this.job.as_mut() {
                let mut out = Vec::new();
                if let Some(pieces) = this.job_pieces.as_mut() {
                    while let Poll::Ready(Some(piece)) = pieces.poll_recv(cx) {
                        out.extend(this.machine.job_piece(piece));
                    }
                }
                if !out.is_empty() {
                    this.replies = out.into_iter();
                    continue;
                }
                let answer = ready!(job.as_mut().poll(cx));
                this.job = None;
                // Parts sent just before the end go out before it.
                if let Some(mut pieces) = this.job_pieces.take() {
                    while let Ok(piece) = pieces.try_recv() {
                        out.extend(this.machine.job_piece(piece));
                    }
                }
                out.extend(this.machine.job_done(answer));
                this.replies = out.into_iter();
                continue;
            }
            match ready!(Pin::new(&mut this.inbound).poll_next(cx)) {
                Some(Ok(message)) if this.machine.is_heavy(&message) => {
                    let stand_in = RequestStream::new(this.shared.gateway.clone());
                    let mut machine = std::mem::replace(&mut this.machine, stand_in);
                    this.working = Some(this.shared.workers.run(move || {
                        let replies = machine.process(message);
                        (machine, replies)
                    }));
                }
                Some(Ok(message)) => {
                    this.replies = this.machine.process(message).into_iter();
                    this.start_fanout();
                }
                // A message that does not decode, or a reset stream (the client went away; nobody
                // hears the status then): the stream ends.
                Some(Err(status)) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                // Envoy closed its side (the exchange is over) or reset the stream (client gone).
                None => this.ended = true,
            }
        }
    }
}

impl ProcessStream {
    /// Before the machine ends an exchange early (a stop, a missed deadline) it still lists the engine call:
    /// keep it, so Drop aborts it once the machine no longer does.
    fn keep_cut_abort(&mut self) {
        self.cut_abort = self
            .machine
            .pending_abort()
            .map(|p| (p.endpoint.to_string(), p.protocol, p.request_id.to_string()));
    }

    /// A batched request's engine calls, if the last message made some.
    fn start_fanout(&mut self) {
        if let Some(calls) = self.machine.take_fanout() {
            let limit = self.shared.gateway.limits.max_engine_message;
            self.fanout = Some(Box::pin(fanout::run(self.shared.aborter.clone(), calls, limit)));
        }
        if let Some(job) = self.machine.take_job() {
            let (aborter, limit) = (
                self.shared.aborter.clone(),
                self.shared.gateway.limits.max_engine_message,
            );
            let engine: responses_api::EngineCaller = Arc::new(move |call| {
                let aborter = aborter.clone();
                Box::pin(async move {
                    let mut outcomes = fanout::run(aborter, vec![call], limit).await;
                    outcomes
                        .pop()
                        .unwrap_or_else(|| Err(crate::error::ApiError::internal("no engine answer")))
                })
            });
            let aborter = self.shared.aborter.clone();
            // A streamed call has the first-token and inter-token deadlines a streamed chat call has.
            let deadlines = self.shared.gateway.limits.deadlines;
            let streaming_engine: responses_api::StreamingEngineCaller = Arc::new(move |call, sink| {
                Box::pin(fanout::run_streamed(aborter.clone(), call, limit, deadlines, sink))
            });
            // The caller sees only its own tenant's responses and conversations: its API key's, or the
            // keyless tenant's when keys are off.
            let owner = job.grant.as_ref().map(|grant| grant.owner.clone());
            let store = self
                .shared
                .responses_store
                .clone()
                .map(|backend| Arc::new(TenantStore::new(backend, owner)) as Arc<dyn ResponseStore>);
            let context = responses_api::Context {
                gateway: self.shared.gateway.clone(),
                store,
                engine,
                streaming_engine,
            };
            let (pieces, received) = mpsc::unbounded_channel();
            self.job = Some(Box::pin(responses_api::serve(context, job, pieces)));
            self.job_pieces = Some(received);
        }
    }

    /// Whether the engine call's deadline passed; else the timer is armed to wake the stream at it.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.machine.deadline() else {
            self.timer = None;
            return false;
        };
        let at = tokio::time::Instant::from_std(deadline);
        match self.timer.as_mut() {
            Some(timer) if timer.deadline() <= at => {}
            Some(timer) => timer.as_mut().reset(at),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(at))),
        }
        let timer = self.timer.as_mut().expect("armed above");
        while timer.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                self.timer = None;
                return true;
            }
            // The engine sent something since the timer was set: wait for the later deadline.
            let later = self.machine.deadline().map(tokio::time::Instant::from_std);
            match later {
                Some(later) => timer.as_mut().reset(later),
                None => {
                    self.timer = None;
                    return false;
                }
            }
        }
        false
    }
}

impl Drop for ProcessStream {
    fn drop(&mut self) {
        let Some(work) = self.working.take() else {
            let pending = self.machine.pending_abort();
            if let Some(p) = pending {
                self.shared.aborter.abort(p.endpoint, p.protocol, p.request_id);
            }
            // A stop's cut: the machine ended the exchange, so it no longer lists the call as pending.
            let cut = self.cut_abort.take();
            if let Some((endpoint, protocol, request_id)) = &cut {
                self.shared.aborter.abort(endpoint, *protocol, request_id);
            }
            record(
                &self.shared,
                &self.machine,
                pending.is_some() || cut.is_some(),
                self.started,
            );
            return;
        };
        // The machine is still on the worker pool: its summary is recorded when it is back. Nothing
        // reached an engine (its replies were never sent), so there is nothing to abort.
        let (shared, started) = (self.shared.clone(), self.started);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Some((machine, _)) = work.await {
                    record(&shared, &machine, false, started);
                }
            });
        }
    }
}

fn record(shared: &Shared, machine: &RequestStream, aborted: bool, started: Instant) {
    machine.record_metrics(started);
    shared.telemetry.record(|| Finished {
        summary: machine.summary(),
        aborted,
        duration: started.elapsed(),
    });
}
